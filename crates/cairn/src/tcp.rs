//! The TCP shell: accept connections, read frames, run the handler, write replies.
//!
//! One task per connection, lockstep like the 0.11 client: read one request frame, answer it,
//! read the next. The frame size is checked against the limit from the header alone, before
//! the body is read into memory. Handlers run on blocking threads (file IO, argon2); a send
//! comes back prepared and is completed here, awaiting its partition's writer without holding
//! a thread.
//! A semaphore bounds connections; one shutdown signal stops the accept loop and every
//! connection between frames.

use crate::handler::{self, Server, Session};
use bytes::BytesMut;
use cairn_storage::read::ReadPart;
use cairn_wire::codes;
use cairn_wire::command::Command;
use cairn_wire::frame::{self, EvictionReason, HEADER_SIZE, HeaderError, RequestHeader};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;

/// Accept connections until `shutdown` flips to true, then wait for every connection task
/// to finish its current request.
pub async fn serve(server: Arc<Server>, listener: TcpListener, mut shutdown: watch::Receiver<bool>) {
    let permits = Arc::new(Semaphore::new(server.config.max_connections as usize));
    let mut connections = JoinSet::new();
    loop {
        let permit = tokio::select! {
            permit = permits.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
            _ = shutdown.changed() => break,
        };
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.changed() => break,
        };
        let (socket, peer) = match accepted {
            Ok(pair) => pair,
            Err(error) => {
                // Running out of file descriptors and the like: log and keep accepting.
                tracing::warn!(%error, "accept failed");
                continue;
            }
        };
        let server = server.clone();
        let shutdown = shutdown.clone();
        // Replies are written with one call each; no reason to hold them back.
        if let Err(error) = socket.set_nodelay(true) {
            tracing::debug!(%error, "cannot set TCP_NODELAY");
        }
        connections.spawn(async move {
            let _permit = permit;
            server.clients_connected.fetch_add(1, Ordering::Relaxed);
            let session = server.new_session(peer.to_string(), handler::TRANSPORT_TCP);
            let client_id = session.client_id;
            server.register_client(&session);
            if let Err(error) = Connection::new(server.clone(), socket, session, shutdown)
                .run()
                .await
            {
                tracing::debug!(%peer, %error, "connection closed");
            }
            // Group membership belongs to the connection: it ends with it. On a blocking
            // thread: it takes the catalog lock, which a metadata save may hold.
            let dropper = server.clone();
            if let Err(error) = tokio::task::spawn_blocking(move || dropper.drop_memberships(client_id)).await
            {
                tracing::error!(%error, "dropping group memberships panicked");
            }
            server.unregister_client(client_id);
            server.clients_connected.fetch_sub(1, Ordering::Relaxed);
        });
        // Reap finished connection tasks so the set does not grow without bound.
        while connections.try_join_next().is_some() {}
    }
    drop(listener);
    while connections.join_next().await.is_some() {}
}

struct Connection {
    server: Arc<Server>,
    socket: TcpStream,
    session: Option<Session>,
    shutdown: watch::Receiver<bool>,
}

impl Connection {
    fn new(
        server: Arc<Server>,
        socket: TcpStream,
        session: Session,
        shutdown: watch::Receiver<bool>,
    ) -> Connection {
        Connection {
            server,
            socket,
            session: Some(session),
            shutdown,
        }
    }

    async fn run(mut self) -> std::io::Result<()> {
        loop {
            let mut header = [0u8; HEADER_SIZE];
            tokio::select! {
                read = self.socket.read_exact(&mut header) => {
                    if let Err(error) = read {
                        // EOF between frames is the normal end of a connection.
                        return if error.kind() == std::io::ErrorKind::UnexpectedEof { Ok(()) } else { Err(error) };
                    }
                }
                _ = self.shutdown.changed() => return Ok(()),
            }
            acknowledge_promptly(&self.socket);
            if !self.serve_frame(&header).await? {
                return Ok(());
            }
        }
    }

    /// Serve one frame whose header is read. Returns false when the connection must close.
    async fn serve_frame(&mut self, raw_header: &[u8; HEADER_SIZE]) -> std::io::Result<bool> {
        let max_frame_bytes = self.server.config.max_frame_bytes;
        let header = match RequestHeader::parse(raw_header, max_frame_bytes) {
            Ok(header) => header,
            Err(HeaderError::SizeTooLarge { size, max }) => {
                // Refused before the body is read: answer, then close, since the unread
                // body would otherwise be taken for the next frame.
                tracing::warn!(
                    size,
                    max,
                    "frame larger than tcp.max_frame_bytes refused; connection closed"
                );
                let fake = fallback_header(raw_header);
                let status = if fake.operation == frame::operation::SEND_MESSAGES {
                    codes::INVALID_MESSAGES_SIZE
                } else {
                    codes::INVALID_FORMAT
                };
                self.write_status(&fake, status).await?;
                return Ok(false);
            }
            Err(HeaderError::SizeTooSmall { size }) => {
                tracing::debug!(size, "frame size below the header size; connection closed");
                return Ok(false);
            }
            Err(error) => {
                // A sane size but a header that breaks the codec's rules: skip its body and
                // answer InvalidCommand, keeping the framing in step.
                let fake = fallback_header(raw_header);
                tracing::debug!(%error, "invalid request header");
                if fake.size < HEADER_SIZE as u32 || fake.size > max_frame_bytes {
                    return Ok(false);
                }
                self.read_body(fake.size).await?;
                self.write_status(&fake, codes::INVALID_COMMAND).await?;
                return Ok(true);
            }
        };
        let body = self.read_body(header.size).await?;
        let command = match Command::decode(header.operation, header.code, body.freeze()) {
            Ok(command) => command,
            Err(error) => {
                tracing::debug!(operation = header.operation, code = header.code, %error, "request refused");
                self.write_status(&header, error.status()).await?;
                return Ok(true);
            }
        };
        let Some(mut session) = self.session.take() else {
            return Ok(false);
        };
        session.vsr_client = header.client;
        tracing::debug!(
            client_id = session.client_id,
            command = command.name(),
            request = header.request,
            "request"
        );
        let server = self.server.clone();
        // The SDK replays a request answered 57 with the same client id and request id: a
        // metadata change is recognised by them (`catalog::handling_client_request`).
        let client_request = (header.client != 0).then_some((header.client, header.request));
        let joined = tokio::task::spawn_blocking(move || {
            let reply = crate::catalog::handling_client_request(client_request, || {
                let handled = server.handle(&mut session, command);
                server.settle_replayed_change(handled)
            });
            (reply, session)
        })
        .await;
        let (handled, session) = match joined {
            Ok(pair) => pair,
            Err(error) => {
                // A panic in a handler is a bug; this connection's session is lost with it.
                tracing::error!(%error, "request handler panicked; closing the connection");
                self.write_status(&header, codes::ERROR).await?;
                return Ok(false);
            }
        };
        self.session = Some(session);
        let reply = match handled {
            handler::Handled::Done(reply) => reply,
            handler::Handled::Prefixed(Ok(payload)) => {
                self.write_ok_prefixed(&header, payload).await?;
                return Ok(true);
            }
            handler::Handled::Prefixed(Err(status)) => Err(status),
            handler::Handled::Send(send) => send.complete().await,
        }
        .map(|typed| typed.encode());
        match reply {
            Ok(payload) => self.write_ok(&header, &payload).await?,
            Err(handler::INCOMPATIBLE_PROTOCOL_STATUS) => {
                let eviction = frame::eviction(
                    header.client,
                    EvictionReason::IncompatibleProtocol,
                    Some((frame::PROTOCOL_VERSION_MAX, frame::PROTOCOL_VERSION_MIN)),
                );
                self.socket.write_all(&eviction).await?;
            }
            Err(status) => self.write_status(&header, status).await?,
        }
        Ok(true)
    }

    /// Read the `size - HEADER_SIZE` body bytes of a frame (`size` was bounded by the
    /// caller). Read straight into the buffer's spare capacity: no zero-fill of memory that is
    /// about to be overwritten (a send body is up to the frame limit).
    async fn read_body(&mut self, size: u32) -> std::io::Result<BytesMut> {
        let body_len = (size as usize).saturating_sub(HEADER_SIZE);
        let mut body = BytesMut::with_capacity(body_len);
        let mut limited = (&mut self.socket).take(body_len as u64);
        while body.len() < body_len {
            if limited.read_buf(&mut body).await? == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
        }
        debug_assert_eq!(body.len(), body_len);
        Ok(body)
    }

    async fn write_ok(&mut self, request: &RequestHeader, payload: &[u8]) -> std::io::Result<()> {
        let framed = frame::is_result_framed(request.operation);
        let section_len = if framed { 4 } else { 0 };
        let body_len = section_len + payload.len();
        let fits = u32::try_from(body_len + HEADER_SIZE).is_ok();
        if !fits {
            tracing::error!(
                body_len,
                "reply larger than a frame can carry; answering an error instead"
            );
            return self.write_status(request, codes::ERROR).await;
        }
        let mut out = Vec::with_capacity(HEADER_SIZE + body_len);
        out.extend_from_slice(&frame::reply_header(request, codes::OK, body_len as u32));
        if framed {
            cairn_wire::reply::ok_result_section(&mut out);
        }
        out.extend_from_slice(payload);
        self.socket.write_all(&out).await
    }

    /// [`Connection::write_ok`] for a payload built behind room for the framing: the reply
    /// header (and result section) go into that room, so header and buffered payload leave in
    /// one write with no copy; whole stored batches go from their segment files with
    /// `sendfile` (they were verified when the poll read them).
    async fn write_ok_prefixed(
        &mut self,
        request: &RequestHeader,
        mut payload: handler::PrefixedPayload,
    ) -> std::io::Result<()> {
        let framed = frame::is_result_framed(request.operation);
        let section_len = if framed { 4 } else { 0 };
        let body_len = section_len + payload.payload_len();
        let Ok(body_len_u32) = u32::try_from(body_len) else {
            return self.refuse_oversized_reply(request, body_len).await;
        };
        if u32::try_from(body_len + HEADER_SIZE).is_err() {
            return self.refuse_oversized_reply(request, body_len).await;
        }
        let frame_start = handler::PrefixedPayload::PREFIX_BYTES - section_len - HEADER_SIZE;
        let (buffer, parts_start, parts) = payload.split_mut();
        buffer[frame_start..frame_start + HEADER_SIZE].copy_from_slice(&frame::reply_header(
            request,
            codes::OK,
            body_len_u32,
        ));
        if framed {
            // The result section of an OK reply: a zero count.
            buffer[frame_start + HEADER_SIZE..handler::PrefixedPayload::PREFIX_BYTES].fill(0);
        }
        // Adjacent buffer bytes are written together.
        let mut pending = frame_start..parts_start;
        for part in parts {
            match part {
                ReadPart::Buffer(range) if range.start == pending.end => pending.end = range.end,
                ReadPart::Buffer(range) => {
                    self.socket.write_all(&buffer[pending]).await?;
                    pending = range.clone();
                }
                ReadPart::File {
                    file,
                    position_bytes,
                    len,
                } => {
                    self.socket.write_all(&buffer[pending.clone()]).await?;
                    pending = pending.end..pending.end;
                    match file.as_file() {
                        Some(file) => send_file(&self.socket, file, *position_bytes, *len).await?,
                        None => {
                            let mut bytes = Vec::new();
                            file.read_exact_at_into(*position_bytes, *len, &mut bytes, 0)
                                .map_err(std::io::Error::other)?;
                            self.socket.write_all(&bytes).await?;
                        }
                    }
                }
            }
        }
        self.socket.write_all(&buffer[pending]).await
    }

    async fn refuse_oversized_reply(
        &mut self,
        request: &RequestHeader,
        body_len: usize,
    ) -> std::io::Result<()> {
        tracing::error!(
            body_len,
            "reply larger than a frame can carry; answering an error instead"
        );
        self.write_status(request, codes::ERROR).await
    }

    async fn write_status(&mut self, request: &RequestHeader, status: u32) -> std::io::Result<()> {
        debug_assert_ne!(status, codes::OK);
        self.socket
            .write_all(&frame::reply_header(request, status, 0))
            .await
    }
}

/// Send `len` bytes of `file` from `position_bytes` to `socket` with `sendfile(2)`: from the
/// page cache to the socket without passing through this process.
async fn send_file(
    socket: &TcpStream,
    file: &std::fs::File,
    position_bytes: u64,
    len: usize,
) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let mut position = libc::off_t::try_from(position_bytes)
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    let end = position
        .checked_add(
            libc::off_t::try_from(len).map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?,
        )
        .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    while position < end {
        let count = usize::try_from(end - position).unwrap_or(usize::MAX);
        let sent = socket
            .async_io(tokio::io::Interest::WRITABLE, || {
                // SAFETY: both descriptors are open for the duration of the call (`socket` and
                // `file` are borrowed), and `position` is a live off_t the kernel advances.
                let sent =
                    unsafe { libc::sendfile(socket.as_raw_fd(), file.as_raw_fd(), &mut position, count) };
                if sent < 0 {
                    Err(std::io::Error::last_os_error())
                } else {
                    Ok(sent as usize)
                }
            })
            .await?;
        if sent == 0 {
            // The file ended early: it was cut under us. The frame cannot be completed.
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "segment file shorter than the batch being sent",
            ));
        }
    }
    Ok(())
}

/// The echo fields of a header that failed validation, read without checks so the error
/// reply still carries the client's ids. Only `size` is bounded by the caller.
fn fallback_header(raw: &[u8; HEADER_SIZE]) -> RequestHeader {
    let u128_at = |at: usize| {
        let mut bytes = [0u8; 16];
        bytes.copy_from_slice(&raw[at..at + 16]);
        u128::from_le_bytes(bytes)
    };
    let u64_at = |at: usize| {
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(&raw[at..at + 8]);
        u64::from_le_bytes(bytes)
    };
    let u32_at = |at: usize| {
        let mut bytes = [0u8; 4];
        bytes.copy_from_slice(&raw[at..at + 4]);
        u32::from_le_bytes(bytes)
    };
    RequestHeader {
        client: u128_at(128),
        request_checksum: u128_at(144),
        request: u64_at(168),
        operation: raw[176],
        session: u64_at(184),
        code: u32_at(196),
        size: u32_at(48),
    }
}

/// Ask the kernel to acknowledge the bytes just received at once instead of delaying the ACK.
///
/// Why: the 0.11 SDK writes a request through an 8 KiB `BufWriter` with Nagle's algorithm on
/// (its default). A request larger than the buffer leaves the client as two segments, and
/// Nagle holds the second until the first is acknowledged, while Linux delays that ACK by up
/// to 40 ms. Measured: 32 producers sending 10 KiB batches waited ~44 ms per send. Linux
/// clears quick-ack mode on its own, so it is re-armed after every header read. Best effort:
/// a failure only costs latency.
fn acknowledge_promptly(socket: &TcpStream) {
    use std::os::fd::AsRawFd;
    let enable: libc::c_int = 1;
    // SAFETY: setsockopt on a socket descriptor we own, with a pointer to a live c_int and
    // its exact size.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_QUICKACK,
            (&enable as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        tracing::trace!(error = %std::io::Error::last_os_error(), "cannot set TCP_QUICKACK");
    }
}
