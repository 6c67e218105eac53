//! The metadata machine's properties: refusals change nothing, the same ops give the same
//! bytes, snapshots and ops survive encoding, and documents it did not write are refused.

use crate::metadata::{
    Effect, Metadata, MetadataDoc, MetadataOp, Outcome, PARTITIONS_PER_TOPIC_MAX, PurgeMark, TopicSettings,
};
use crate::users::{ROOT_USER_ID, USER_STATUS_ACTIVE};
use cairn_wire::codes;
use proptest::prelude::*;

/// Apply `op`, which must be accepted; what it created.
fn created(state: &mut Metadata, op: MetadataOp) -> Outcome {
    match state.apply(&op) {
        Ok(applied) => applied.outcome,
        Err(status) => panic!("{op:?} refused with {status}"),
    }
}

fn stream(name: &str) -> MetadataOp {
    MetadataOp::CreateStream {
        name: name.to_string(),
        created_at_us: 7,
    }
}

fn topic(stream_id: u32, name: &str, partitions_count: u32) -> MetadataOp {
    MetadataOp::CreateTopic {
        stream_id,
        name: name.to_string(),
        created_at_us: 9,
        partitions_count,
        settings: TopicSettings::default(),
    }
}

/// Apply `op`, expecting `status`, and check the state did not move.
fn refused(state: &mut Metadata, op: MetadataOp, status: u32) {
    let before = state.clone();
    assert_eq!(state.apply(&op).map(|a| a.outcome), Err(status), "{op:?}");
    assert_eq!(*state, before, "a refused op changed the state: {op:?}");
}

#[test]
fn ids_come_from_the_state_and_are_never_reused() {
    let mut state = Metadata::default();
    assert_eq!(created(&mut state, stream("a")), Outcome::Stream(0));
    assert_eq!(created(&mut state, stream("b")), Outcome::Stream(1));
    state
        .apply(&MetadataOp::DeleteStream { stream_id: 1 })
        .expect("delete");
    assert_eq!(created(&mut state, stream("b")), Outcome::Stream(2));
    assert_eq!(
        created(&mut state, topic(0, "t", 3)),
        Outcome::Topic {
            stream_id: 0,
            topic_id: 0
        }
    );
    let applied = state
        .apply(&MetadataOp::CreatePartitions {
            stream_id: 0,
            topic_id: 0,
            count: 2,
            created_at_us: 11,
        })
        .expect("partitions");
    assert_eq!(
        applied.effects,
        vec![Effect::CreatePartitions {
            stream_id: 0,
            topic_id: 0,
            first: 3,
            count: 2
        }]
    );
    let doc = &state.streams[&0].topics[&0];
    assert_eq!(doc.partitions_count(), 5);
    assert!(doc.partitions.iter().enumerate().all(|(i, p)| p.id as usize == i));
}

#[test]
fn refusals_change_nothing() {
    let mut state = Metadata::default();
    created(&mut state, stream("a"));
    created(&mut state, topic(0, "t", 1));
    refused(&mut state, stream("a"), codes::STREAM_NAME_ALREADY_EXISTS);
    refused(&mut state, stream(""), codes::INVALID_STREAM_NAME);
    refused(&mut state, topic(0, "t", 1), codes::TOPIC_NAME_ALREADY_EXISTS);
    refused(&mut state, topic(5, "u", 1), codes::STREAM_ID_NOT_FOUND);
    refused(
        &mut state,
        topic(0, "u", PARTITIONS_PER_TOPIC_MAX + 1),
        codes::INVALID_PARTITIONS_COUNT,
    );
    refused(
        &mut state,
        MetadataOp::CreatePartitions {
            stream_id: 0,
            topic_id: 0,
            count: PARTITIONS_PER_TOPIC_MAX,
            created_at_us: 1,
        },
        codes::INVALID_PARTITIONS_COUNT,
    );
    refused(
        &mut state,
        MetadataOp::DeletePartitions {
            stream_id: 0,
            topic_id: 0,
            count: 2,
        },
        codes::INVALID_PARTITIONS_COUNT,
    );
    // A purge mark below the recorded one would bring purged offsets back.
    state
        .apply(&MetadataOp::MarkPurge {
            stream_id: 0,
            marks: vec![PurgeMark {
                topic_id: 0,
                partition_id: 0,
                target: 10,
            }],
        })
        .expect("mark");
    refused(
        &mut state,
        MetadataOp::MarkPurge {
            stream_id: 0,
            marks: vec![PurgeMark {
                topic_id: 0,
                partition_id: 0,
                target: 9,
            }],
        },
        codes::INVALID_OFFSET,
    );
    // Root.
    state
        .apply(&MetadataOp::CreateRoot {
            password_hash: "h".to_string(),
            created_at_us: 1,
        })
        .expect("root");
    refused(
        &mut state,
        MetadataOp::DeleteUser {
            user_id: ROOT_USER_ID,
        },
        codes::CANNOT_DELETE_USER,
    );
    refused(
        &mut state,
        MetadataOp::UpdateUser {
            user_id: ROOT_USER_ID,
            username: None,
            status: Some(2),
        },
        codes::CANNOT_CHANGE_PERMISSIONS,
    );
    refused(
        &mut state,
        MetadataOp::ChangePassword {
            user_id: ROOT_USER_ID,
            expected_hash: "not the stored one".to_string(),
            new_hash: "x".to_string(),
        },
        codes::INVALID_CREDENTIALS,
    );
    // Token ids never go back: a raw token already handed out names only its own token.
    state
        .apply(&MetadataOp::CreateToken {
            user_id: ROOT_USER_ID,
            token_id: 4,
            name: "one".to_string(),
            token_hash: "h".to_string(),
            expiry_at_us: 0,
        })
        .expect("token");
    refused(
        &mut state,
        MetadataOp::CreateToken {
            user_id: ROOT_USER_ID,
            token_id: 4,
            name: "two".to_string(),
            token_hash: "h".to_string(),
            expiry_at_us: 0,
        },
        codes::INVALID_PAT,
    );
}

#[test]
fn deleting_a_user_deletes_its_tokens() {
    let mut state = Metadata::default();
    let Outcome::User(id) = created(
        &mut state,
        MetadataOp::CreateUser {
            username: "alice".to_string(),
            password_hash: "h".to_string(),
            status: USER_STATUS_ACTIVE,
            permissions: None,
            created_at_us: 1,
        },
    ) else {
        panic!("not a user");
    };
    created(
        &mut state,
        MetadataOp::CreateToken {
            user_id: id,
            token_id: 0,
            name: "tok".to_string(),
            token_hash: "h".to_string(),
            expiry_at_us: 0,
        },
    );
    assert_eq!(
        created(&mut state, MetadataOp::DeleteUser { user_id: id }),
        Outcome::Done
    );
    assert!(state.tokens.is_empty());
}

/// A document written before consumer groups existed still loads: the new topic fields
/// default to no groups and ids from 0.
#[test]
fn metadata_without_group_fields_loads() {
    let json = r#"{"format_version":1,"next_stream_id":1,"streams":[{"id":0,"name":"s","created_at_us":1,
        "next_topic_id":4,"topics":[{"id":3,"name":"t","created_at_us":1,"message_expiry_us":0,
        "compression":1,"max_topic_size_bytes":0,"partitions":[{"id":0,"created_at_us":1}]}]}],
        "next_user_id":0,"users":[],"next_token_id":0,"tokens":[]}"#;
    let state = Metadata::restore(json.as_bytes()).expect("old document loads");
    let topic = &state.streams[&0].topics[&3];
    assert!(topic.consumer_groups.is_empty());
    assert_eq!(topic.next_group_id, 0);
}

#[test]
fn documents_that_break_an_invariant_are_refused() {
    let mut state = Metadata::default();
    created(&mut state, stream("a"));
    created(&mut state, topic(0, "t", 2));
    let good = state.to_doc();
    let mut twice = good.clone();
    twice.streams.push(twice.streams[0].clone());
    twice.next_stream_id = 5;
    let mut misnumbered = good.clone();
    misnumbered.streams[0].topics[0].partitions[1].id = 7;
    let mut unreached = good.clone();
    unreached.next_stream_id = 0;
    let mut version = good.clone();
    version.format_version = 2;
    for (what, doc) in [
        ("a stream listed twice", twice),
        ("a misnumbered partition", misnumbered),
        ("an id at or above its counter", unreached),
        ("another format version", version),
    ] {
        assert!(Metadata::from_doc(doc).is_err(), "{what} was accepted");
    }
    assert_eq!(Metadata::from_doc(good).expect("good document"), state);
}

/// A small alphabet of ops over few names and ids, so that many of them collide and are
/// refused, and many succeed.
fn op_strategy() -> impl Strategy<Value = MetadataOp> {
    let name = prop::sample::select(vec!["a", "b", "c"]).prop_map(str::to_string);
    let id = 0u32..4;
    prop_oneof![
        (name.clone(), any::<u64>())
            .prop_map(|(name, created_at_us)| MetadataOp::CreateStream { name, created_at_us }),
        (id.clone(), name.clone()).prop_map(|(stream_id, name)| MetadataOp::UpdateStream { stream_id, name }),
        id.clone()
            .prop_map(|stream_id| MetadataOp::DeleteStream { stream_id }),
        (id.clone(), name.clone(), 0u32..4, prop::option::of(any::<u64>())).prop_map(
            |(stream_id, name, partitions_count, expiry)| MetadataOp::CreateTopic {
                stream_id,
                name,
                created_at_us: 3,
                partitions_count,
                settings: TopicSettings {
                    message_expiry_us: expiry,
                    ..TopicSettings::default()
                },
            }
        ),
        (id.clone(), id.clone())
            .prop_map(|(stream_id, topic_id)| MetadataOp::DeleteTopic { stream_id, topic_id }),
        (id.clone(), id.clone(), 0u32..3).prop_map(|(stream_id, topic_id, count)| {
            MetadataOp::CreatePartitions {
                stream_id,
                topic_id,
                count,
                created_at_us: 5,
            }
        }),
        (id.clone(), id.clone(), 0u32..3).prop_map(|(stream_id, topic_id, count)| {
            MetadataOp::DeletePartitions {
                stream_id,
                topic_id,
                count,
            }
        }),
        (id.clone(), id.clone(), name.clone()).prop_map(|(stream_id, topic_id, name)| {
            MetadataOp::CreateGroup {
                stream_id,
                topic_id,
                name,
            }
        }),
        (id.clone(), id.clone(), id.clone()).prop_map(|(stream_id, topic_id, group_id)| {
            MetadataOp::DeleteGroup {
                stream_id,
                topic_id,
                group_id,
            }
        }),
        (name.clone(), 0u8..4).prop_map(|(username, status)| MetadataOp::CreateUser {
            username: format!("user-{username}"),
            password_hash: "hash".to_string(),
            status,
            permissions: None,
            created_at_us: 1,
        }),
        id.clone().prop_map(|user_id| MetadataOp::DeleteUser { user_id }),
        (id.clone(), 0u64..6, name.clone()).prop_map(|(user_id, token_id, name)| MetadataOp::CreateToken {
            user_id,
            token_id,
            name: format!("token-{name}"),
            token_hash: "hash".to_string(),
            expiry_at_us: 0,
        }),
        (id.clone(), id.clone(), 0u32..4, 0u64..100).prop_map(
            |(stream_id, topic_id, partition_id, target)| {
                MetadataOp::MarkPurge {
                    stream_id,
                    marks: vec![PurgeMark {
                        topic_id,
                        partition_id,
                        target,
                    }],
                }
            }
        ),
    ]
}

proptest! {
    /// Two replicas applying the same ops agree byte for byte at every step, whether one of
    /// them went through a snapshot and a restore at some point or not; a refused op leaves
    /// the state as it was; every op survives its encoding.
    #[test]
    fn same_ops_same_bytes(ops in prop::collection::vec(op_strategy(), 1..60), restore_at in 0usize..60) {
        let mut a = Metadata::default();
        let mut b = Metadata::default();
        for (index, op) in ops.iter().enumerate() {
            let decoded = MetadataOp::decode(&op.encode()).expect("op decodes");
            prop_assert_eq!(&decoded, op);
            let before = a.clone();
            let applied_a = a.apply(op);
            let applied_b = b.apply(&decoded);
            prop_assert_eq!(&applied_a, &applied_b);
            if applied_a.is_err() {
                prop_assert_eq!(&a, &before);
            }
            if index == restore_at {
                b = Metadata::restore(&b.snapshot()).expect("snapshot restores");
            }
            prop_assert_eq!(a.snapshot(), b.snapshot());
        }
        let doc: MetadataDoc = serde_json::from_slice(&a.snapshot()).expect("snapshot is a document");
        prop_assert_eq!(Metadata::from_doc(doc).expect("document loads"), a);
    }
}

/// Ops with nested maps keyed by ids (permissions per stream and topic) survive their
/// encoding: the replicated log carries exactly what the preparer decided.
#[test]
fn ops_with_permissions_survive_encoding() {
    use crate::permissions::{GlobalDoc, PermissionsDoc, StreamDoc, TopicDoc};
    let mut streams = std::collections::BTreeMap::new();
    let mut topics = std::collections::BTreeMap::new();
    topics.insert(
        7,
        TopicDoc {
            poll_messages: true,
            ..TopicDoc::default()
        },
    );
    streams.insert(
        3,
        StreamDoc {
            read_stream: true,
            topics,
            ..StreamDoc::default()
        },
    );
    streams.insert(4, StreamDoc::default());
    let permissions = Some(PermissionsDoc {
        global: GlobalDoc {
            read_users: true,
            ..GlobalDoc::default()
        },
        streams,
    });
    for op in [
        MetadataOp::CreateUser {
            username: "reader".to_string(),
            password_hash: "hash".to_string(),
            status: USER_STATUS_ACTIVE,
            permissions: permissions.clone(),
            created_at_us: 1,
        },
        MetadataOp::UpdatePermissions {
            user_id: 3,
            permissions,
        },
        MetadataOp::Migrate {
            doc: Metadata::default().to_doc(),
        },
    ] {
        assert_eq!(MetadataOp::decode(&op.encode()), Ok(op));
    }
}
