use crate::frame::{
    self, COMMAND_EVICTION, COMMAND_REPLY, EvictionReason, HEADER_SIZE, HeaderError, RequestHeader,
};

const MAX: u32 = 1 << 20;

fn request(operation: u8, session: u64, request: u64, code: u32, body_len: u32) -> [u8; HEADER_SIZE] {
    let mut h = [0u8; HEADER_SIZE];
    h[48..52].copy_from_slice(&(256 + body_len).to_le_bytes());
    h[60] = 5;
    h[128..144].copy_from_slice(&0x1234_5678_9abc_def0_1122_3344_5566_7788u128.to_le_bytes());
    h[144..152].copy_from_slice(&0xdead_beefu64.to_le_bytes());
    h[168..176].copy_from_slice(&request.to_le_bytes());
    h[176] = operation;
    h[184..192].copy_from_slice(&session.to_le_bytes());
    h[196..200].copy_from_slice(&code.to_le_bytes());
    h
}

#[test]
fn parses_a_ping_before_login() {
    let h = RequestHeader::parse(&request(2, 0, 1, 1, 0), MAX).unwrap();
    assert_eq!(h.client, 0x1234_5678_9abc_def0_1122_3344_5566_7788);
    assert_eq!(h.request_checksum, 0xdead_beef);
    assert_eq!(h.request, 1);
    assert_eq!(h.operation, 2);
    assert_eq!(h.session, 0);
    assert_eq!(h.code, 1);
    assert_eq!(h.size, 256);
    assert_eq!(h.body_len(), 0);
}

#[test]
fn parses_register_and_replicated() {
    let h = RequestHeader::parse(&request(1, 0, 0, 0, 34), MAX).unwrap();
    assert_eq!(h.body_len(), 34);
    RequestHeader::parse(&request(128, 7, 1, 0, 3), MAX).unwrap();
    RequestHeader::parse(&request(3, 7, 2, 0, 0), MAX).unwrap();
}

#[test]
fn refuses_non_requests_and_bad_sizes() {
    let mut h = request(2, 0, 1, 1, 0);
    h[60] = 8;
    assert_eq!(
        RequestHeader::parse(&h, MAX),
        Err(HeaderError::NotARequest { command: 8 })
    );

    let mut h = request(2, 0, 1, 1, 0);
    h[48..52].copy_from_slice(&255u32.to_le_bytes());
    assert_eq!(
        RequestHeader::parse(&h, MAX),
        Err(HeaderError::SizeTooSmall { size: 255 })
    );

    let h = request(2, 0, 1, 1, MAX);
    assert_eq!(
        RequestHeader::parse(&h, MAX),
        Err(HeaderError::SizeTooLarge {
            size: MAX + 256,
            max: MAX
        })
    );
    // Exactly at the limit is fine.
    RequestHeader::parse(&request(2, 0, 1, 1, MAX - 256), MAX).unwrap();
}

#[test]
fn applies_codec_rules() {
    let mut h = request(2, 0, 1, 1, 0);
    h[128..144].fill(0);
    assert!(matches!(
        RequestHeader::parse(&h, MAX),
        Err(HeaderError::Invalid(_))
    ));

    assert!(matches!(
        RequestHeader::parse(&request(0, 1, 1, 0, 0), MAX),
        Err(HeaderError::Invalid(_))
    ));
    // Register needs session 0 and request 0.
    assert!(matches!(
        RequestHeader::parse(&request(1, 1, 0, 0, 0), MAX),
        Err(HeaderError::Invalid(_))
    ));
    assert!(matches!(
        RequestHeader::parse(&request(1, 0, 1, 0, 0), MAX),
        Err(HeaderError::Invalid(_))
    ));
    // Replicated ops and logout need both.
    assert!(matches!(
        RequestHeader::parse(&request(128, 0, 1, 0, 0), MAX),
        Err(HeaderError::Invalid(_))
    ));
    assert!(matches!(
        RequestHeader::parse(&request(160, 5, 0, 0, 0), MAX),
        Err(HeaderError::Invalid(_))
    ));
    assert!(matches!(
        RequestHeader::parse(&request(3, 0, 1, 0, 0), MAX),
        Err(HeaderError::Invalid(_))
    ));
    // Op 2 may carry any session and any request id.
    RequestHeader::parse(&request(2, 9, 0, 201, 0), MAX).unwrap();
}

#[test]
fn reply_header_echoes_the_request() {
    let req = RequestHeader::parse(&request(132, 3, 4, 0, 10), MAX).unwrap();
    let r = frame::reply_header(&req, 0, 123);
    assert_eq!(u32::from_le_bytes(r[48..52].try_into().unwrap()), 256 + 123);
    assert_eq!(r[60], COMMAND_REPLY);
    assert_eq!(u128::from_le_bytes(r[128..144].try_into().unwrap()), 0xdead_beef);
    assert_eq!(u128::from_le_bytes(r[160..176].try_into().unwrap()), req.client);
    assert_eq!(u64::from_le_bytes(r[200..208].try_into().unwrap()), 4);
    assert_eq!(r[208], 132);
    assert_eq!(u32::from_le_bytes(r[216..220].try_into().unwrap()), 0);
    // Everything else is zero.
    let zero_ranges = [0..48, 52..60, 61..128, 144..160, 176..200, 209..216, 220..256];
    for range in zero_ranges {
        assert!(r[range.clone()].iter().all(|&b| b == 0), "{range:?}");
    }

    let r = frame::reply_header(&req, 1012, 0);
    assert_eq!(u32::from_le_bytes(r[216..220].try_into().unwrap()), 1012);
    assert_eq!(u32::from_le_bytes(r[48..52].try_into().unwrap()), 256);
}

#[test]
fn eviction_frames() {
    let e = frame::eviction(42, EvictionReason::IncompatibleProtocol, Some((0x2FFF, 0x2C00)));
    assert_eq!(u32::from_le_bytes(e[48..52].try_into().unwrap()), 256);
    assert_eq!(e[60], COMMAND_EVICTION);
    assert_eq!(u128::from_le_bytes(e[128..144].try_into().unwrap()), 42);
    assert_eq!(u32::from_le_bytes(e[144..148].try_into().unwrap()), 0x2FFF);
    assert_eq!(u32::from_le_bytes(e[148..152].try_into().unwrap()), 0x2C00);
    assert!(e[152..255].iter().all(|&b| b == 0));
    assert_eq!(e[255], 14);

    // Versions only travel with reason 14.
    let e = frame::eviction(42, EvictionReason::InvalidCredentials, Some((1, 1)));
    assert!(e[144..255].iter().all(|&b| b == 0));
    assert_eq!(e[255], 9);
    assert_eq!(frame::eviction(1, EvictionReason::MalformedLogin, None)[255], 15);
}

#[test]
fn result_framed_operations() {
    let framed: Vec<u8> = (0..=255u8).filter(|&op| frame::is_result_framed(op)).collect();
    let mut expected = vec![1u8, 64, 65, 66, 67, 68];
    expected.extend(128..=137);
    expected.extend(139..=149);
    expected.extend([161, 162]);
    assert_eq!(framed, expected);
    assert!(!frame::is_result_framed(138));
    assert!(!frame::is_result_framed(160));
    assert!(!frame::is_result_framed(2));
    assert!(!frame::is_result_framed(3));
}
