//! Moving more bytes than one message holds to or from a memory resource:
//! split into messages of at most the path's MTU, a bounded window of them
//! in flight at once (each one-sided request waits for its own
//! completion), the first error ending the transfer.

use bytes::Bytes;
use uniplane_client::{ClientError, MappedMemory, Session};
use uniplane_dataplane::wire::ReqType;
use uniplane_dataplane::{MemoryAddress, Message};

/// One-sided requests in flight at once.
pub const WINDOW: usize = 32;

/// The smallest payload a tunnel carries: the path MTU to assume when
/// nothing better is known.
pub const SMALLEST_MTU: usize = 256;

/// The messages of `len` bytes from `at` in pieces of at most `mtu`:
/// (offset, address, length).
fn pieces(
    at: MemoryAddress,
    len: u64,
    mtu: usize,
) -> Result<impl Iterator<Item = (u64, MemoryAddress, usize)>, ClientError> {
    let mtu = mtu.clamp(1, Message::MAX_PAYLOAD) as u64;
    if at.addr.checked_add(len).is_none() {
        return Err(ClientError::Protocol(format!(
            "{len} bytes at {at} run past the end of the address space"
        )));
    }
    Ok((0..len.div_ceil(mtu)).map(move |i| {
        let offset = i * mtu;
        let address = MemoryAddress {
            uid: at.uid,
            addr: at.addr + offset,
        };
        (offset, address, (len - offset).min(mtu) as usize)
    }))
}

/// Writes `data` at `at`; how many messages it took. The messages carry
/// slices of `data` (no copy) and go as one batch of one-sided requests
/// ([`Session::one_sided_batch`]): every WRTE is still acknowledged by
/// its WRTE_CMPL, and the first failed one fails the transfer.
pub async fn write(
    session: &Session,
    at: MemoryAddress,
    data: Bytes,
    mtu: usize,
) -> Result<usize, ClientError> {
    let me = session.uid();
    let mut bad = None;
    let requests = pieces(at, data.len() as u64, mtu)?.map_while(|(offset, address, len)| {
        let start = offset as usize;
        Message::write(me, address, data.slice(start..start + len))
            .map_err(|e| bad = Some(ClientError::Protocol(e.to_string())))
            .ok()
    });
    let count = session
        .one_sided_batch(requests, WINDOW, |_, m| match m.kind() {
            ReqType::WriteCmpl => Ok(()),
            other => Err(ClientError::Protocol(format!(
                "a write answered with {other:?}"
            ))),
        })
        .await?;
    bad.map_or(Ok(count), Err)
}

/// Reads `len` bytes at `at` into a fresh buffer.
pub async fn read(
    session: &Session,
    at: MemoryAddress,
    len: u64,
    mtu: usize,
) -> Result<Vec<u8>, ClientError> {
    let size = usize::try_from(len)
        .map_err(|_| ClientError::Protocol(format!("{len} bytes do not fit in memory")))?;
    let mut out = vec![0u8; size];
    read_into(session, at, &mut out, mtu).await?;
    Ok(out)
}

/// Fills `out` with the bytes at `at`: each answer is copied once, to its
/// place, in whatever order the answers come, so a caller that reuses
/// `out` pays no allocation and no page faults per transfer.
pub async fn read_into(
    session: &Session,
    at: MemoryAddress,
    out: &mut [u8],
    mtu: usize,
) -> Result<(), ClientError> {
    let size = out.len();
    let me = session.uid().at(0);
    let piece = mtu.clamp(1, Message::MAX_PAYLOAD);
    let mut bad = None;
    let requests = pieces(at, size as u64, mtu)?.map_while(|(_, address, len)| {
        Message::read(me, address, len as u16)
            .map_err(|e| bad = Some(ClientError::Protocol(e.to_string())))
            .ok()
    });
    session
        .one_sided_batch(requests, WINDOW, |index, m| {
            let offset = index * piece;
            let want = piece.min(size - offset);
            let payload = m.payload();
            if m.kind() != ReqType::ReadCmpl || payload.len() != want {
                return Err(ClientError::Protocol(format!(
                    "a read of {want} bytes answered with {:?} of {} bytes",
                    m.kind(),
                    payload.len()
                )));
            }
            out[offset..offset + want].copy_from_slice(payload);
            Ok(())
        })
        .await?;
    bad.map_or(Ok(()), Err)
}

/// Bytes from which [`Route::Auto`] maps the memory: a mapping costs a
/// control round trip to set up, and when the session ends the daemon
/// takes the memory back by copying the whole region once, so smaller
/// transfers go by messages.
pub const AUTO_MAP_FROM: usize = 1 << 20;

/// How a transfer goes (`uniplane write/read --path`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// Map the memory when the daemon lends it and the transfer is at
    /// least [`AUTO_MAP_FROM`] bytes, else messages.
    Auto,
    /// Map the memory, or fail with the daemon's reason.
    Map,
    /// One-sided messages through the engine.
    Messages,
}

/// How a transfer went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Went {
    /// Copied into or out of a mapping of the memory.
    Mapped,
    /// In this many messages.
    Messages(usize),
}

/// A mapping of `at`'s memory as `route` asks: `None` to go by messages
/// (asked for, or `Auto` and the daemon does not lend this memory to this
/// process — another server's, not host memory, or the rules say no;
/// `writable` asks for a mapping writes may go through).
async fn mapping(
    session: &Session,
    at: MemoryAddress,
    len: usize,
    route: Route,
    writable: bool,
) -> Result<Option<MappedMemory>, ClientError> {
    let map = match route {
        Route::Messages => return Ok(None),
        Route::Map => return session.map(at.uid).await.map(Some),
        Route::Auto if at.uid.server() != session.uid().server() || len < AUTO_MAP_FROM => {
            return Ok(None)
        }
        Route::Auto => session.map(at.uid).await,
    };
    match map {
        Ok(m) if m.writable() || !writable => Ok(Some(m)),
        Ok(_) | Err(ClientError::Daemon { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Writes `data` at `at` by `route`.
pub async fn write_by(
    session: &Session,
    at: MemoryAddress,
    data: Bytes,
    mtu: usize,
    route: Route,
) -> Result<Went, ClientError> {
    match mapping(session, at, data.len(), route, true).await? {
        Some(mut m) => m.write(at.addr, &data).await.map(|()| Went::Mapped),
        None => write(session, at, data, mtu).await.map(Went::Messages),
    }
}

/// Fills `out` with the bytes at `at` by `route`.
pub async fn read_by(
    session: &Session,
    at: MemoryAddress,
    out: &mut [u8],
    mtu: usize,
    route: Route,
) -> Result<Went, ClientError> {
    match mapping(session, at, out.len(), route, false).await? {
        Some(mut m) => m.read_into(at.addr, out).await.map(|()| Went::Mapped),
        None => read_into(session, at, out, mtu)
            .await
            .map(|()| Went::Messages(out.len().div_ceil(mtu.clamp(1, Message::MAX_PAYLOAD)))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_cover_the_bytes_in_mtu_sized_messages() {
        let at: MemoryAddress = "10.0.0.1:3@100".parse().unwrap();
        let p: Vec<_> = pieces(at, 2500, 1000)
            .unwrap()
            .map(|(o, a, l)| (o, a.addr, l))
            .collect();
        assert_eq!(p, [(0, 100, 1000), (1000, 1100, 1000), (2000, 2100, 500)]);
        assert_eq!(pieces(at, 0, 1000).unwrap().count(), 0);
    }

    #[test]
    fn no_piece_is_larger_than_a_message() {
        let at: MemoryAddress = "10.0.0.1:3@0".parse().unwrap();
        assert!(pieces(at, 1 << 20, 1 << 20)
            .unwrap()
            .all(|(_, _, l)| l <= Message::MAX_PAYLOAD));
    }

    #[test]
    fn a_transfer_past_the_address_space_is_refused() {
        let at: MemoryAddress = "10.0.0.1:3@0".parse().unwrap();
        let at = MemoryAddress {
            addr: u64::MAX - 10,
            ..at
        };
        assert!(pieces(at, 100, 64).is_err());
    }
}
