//! [`MappedMemory`]: a local host memory device's bytes mapped into this
//! process — a one-sided WRITE or READ becomes the process's own copy,
//! with no message, no engine pass and no system call.
//!
//! The daemon lends the mapping as its access rules allow (READ; WRTE too
//! for a writable one) and takes it back when they no longer do or the
//! session ends: every access checks the grant word the daemon keeps
//! beside the memory (the protocol of `uniplane_shm::grant`), and one
//! overtaken by a take-back is mapped again and redone, or refused with
//! the daemon's reason.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::io::{AsyncWriteExt, Interest};
use tokio::net::UnixStream;
use uniplane_dataplane::wire::Status;
use uniplane_dataplane::Uid;
use uniplane_shm::grant::{read_under, write_under, Access, Grant, GrantView};
use uniplane_shm::sys::{recv_with_fds, ReadOnlyMemory, SharedMemory};

use crate::control::ControlChannel;
use crate::protocol::{MapHello, Mapping, Request};
use crate::ClientError;

/// How often an access follows the memory to a new mapping before it
/// gives up (each time the daemon took it back while the access ran).
const REMAPS: usize = 8;

enum Memory {
    Writable(SharedMemory),
    ReadOnly(ReadOnlyMemory),
}

struct Lease {
    memory: Memory,
    grant: GrantView,
    writable: bool,
}

impl Lease {
    /// Writes under the grant; a read-only mapping writes nothing
    /// (`OutOfRange`).
    fn write(&self, offset: usize, data: &[u8]) -> Access {
        match &self.memory {
            Memory::Writable(m) => write_under(&self.grant, m, offset, data),
            Memory::ReadOnly(_) => Access::OutOfRange,
        }
    }

    /// Reads under the grant.
    fn read(&self, offset: usize, dst: &mut [u8]) -> Access {
        match &self.memory {
            Memory::Writable(m) => read_under(&self.grant, m, offset, dst),
            Memory::ReadOnly(m) => read_under(&self.grant, m, offset, dst),
        }
    }
}

/// A local host memory device's bytes mapped into this process (see
/// [`crate::Session::map`]).
pub struct MappedMemory {
    device: Uid,
    len: usize,
    control: Weak<ControlChannel>,
    lease: Lease,
    remaps: u64,
}

impl std::fmt::Debug for MappedMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MappedMemory")
            .field("device", &self.device)
            .field("len", &self.len)
            .field("writable", &self.lease.writable)
            .finish()
    }
}

impl MappedMemory {
    pub(crate) async fn open(
        control: &Arc<ControlChannel>,
        device: Uid,
    ) -> Result<MappedMemory, ClientError> {
        let (lease, len) = lease(control, device).await?;
        Ok(MappedMemory {
            device,
            len,
            control: Arc::downgrade(control),
            lease,
            remaps: 0,
        })
    }

    /// The device.
    pub fn device(&self) -> Uid {
        self.device
    }

    /// Bytes of the memory.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true: a memory device has at least one byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether the access rules let this process write the memory (as
    /// they stood at the last mapping).
    pub fn writable(&self) -> bool {
        self.lease.writable
    }

    /// Times the daemon took the memory back and it was mapped again.
    pub fn remaps(&self) -> u64 {
        self.remaps
    }

    fn out_of_range(&self, offset: u64, len: usize) -> Option<usize> {
        let start = usize::try_from(offset).ok()?;
        (start.checked_add(len)? <= self.len).then_some(start)
    }

    /// Writes `data` at `offset`: the one-sided WRITE as this process's
    /// own copy. `Status(OutOfRange)` (nothing written) past the end; an
    /// error from the daemon when the rules no longer allow writes.
    pub async fn write(&mut self, offset: u64, data: &[u8]) -> Result<(), ClientError> {
        let start = self
            .out_of_range(offset, data.len())
            .ok_or(ClientError::Status(Status::OutOfRange))?;
        for _ in 0..REMAPS {
            if !self.lease.writable {
                return Err(read_only(self.device));
            }
            let access = self.lease.write(start, data);
            match access {
                Access::Done => return Ok(()),
                Access::OutOfRange => return Err(ClientError::Status(Status::OutOfRange)),
                Access::Revoked => self.remap().await?,
            }
        }
        Err(moving(self.device))
    }

    /// Reads `dst.len()` bytes at `offset` into `dst`: the one-sided READ
    /// as this process's own copy.
    pub async fn read_into(&mut self, offset: u64, dst: &mut [u8]) -> Result<(), ClientError> {
        let start = self
            .out_of_range(offset, dst.len())
            .ok_or(ClientError::Status(Status::OutOfRange))?;
        for _ in 0..REMAPS {
            let access = self.lease.read(start, dst);
            match access {
                Access::Done => return Ok(()),
                Access::OutOfRange => return Err(ClientError::Status(Status::OutOfRange)),
                Access::Revoked => self.remap().await?,
            }
        }
        Err(moving(self.device))
    }

    /// Asks the daemon for the memory again after it took it back: the
    /// rules decide anew (a writable mapping may come back read-only, or
    /// not at all).
    async fn remap(&mut self) -> Result<(), ClientError> {
        let control = self.control.upgrade().ok_or_else(|| ClientError::Daemon {
            kind: "not-attached".into(),
            message: "the session that mapped this memory has ended".into(),
        })?;
        let (lease, len) = lease(&control, self.device).await?;
        if len != self.len {
            return Err(ClientError::Protocol(format!(
                "the memory came back as {len} bytes, not {}",
                self.len
            )));
        }
        self.lease = lease;
        self.remaps += 1;
        Ok(())
    }
}

fn read_only(device: Uid) -> ClientError {
    ClientError::Daemon {
        kind: "denied".into(),
        message: format!("the access rules let this process read {device}'s memory, not write it"),
    }
}

fn moving(device: Uid) -> ClientError {
    ClientError::Daemon {
        kind: "resources".into(),
        message: format!("{device}'s memory was taken back {REMAPS} times during one access"),
    }
}

/// Asks for a mapping of `device` and claims it on the data socket.
async fn lease(control: &ControlChannel, device: Uid) -> Result<(Lease, usize), ClientError> {
    lease_for(
        control,
        &Request::Map {
            device: device.device(),
        },
    )
    .await
}

/// Sends `request` (a map, a share or a shared mapping) and claims the
/// mapping its answer gives on the data socket.
async fn lease_for(
    control: &ControlChannel,
    request: &Request,
) -> Result<(Lease, usize), ClientError> {
    let v = control.request(request).await?;
    let m: Mapping = serde_json::from_value(v).map_err(|e| ClientError::Protocol(e.to_string()))?;
    let len =
        usize::try_from(m.len).map_err(|_| ClientError::Protocol("memory too large".into()))?;
    let mut sock = UnixStream::connect(&m.data_socket)
        .await
        .map_err(|source| ClientError::Unreachable {
            path: m.data_socket.clone(),
            source,
        })?;
    sock.write_all(&m.token.to_le_bytes())
        .await
        .map_err(|e| ClientError::Protocol(e.to_string()))?;
    let mut hello = [0u8; MapHello::BYTES + 1];
    let mut fds: Vec<OwnedFd> = Vec::new();
    let n = tokio::time::timeout(
        Duration::from_secs(5),
        sock.async_io(Interest::READABLE, || {
            fds.clear();
            recv_with_fds(sock.as_fd(), &mut hello, &mut fds)
        }),
    )
    .await
    .map_err(|_| ClientError::Timeout)?
    .map_err(|e| ClientError::Protocol(format!("mapping: {e}")))?;
    let h = MapHello::decode(&hello[..n])
        .ok_or_else(|| ClientError::Protocol("the daemon refused the mapping's token".into()))?;
    let mismatch =
        || ClientError::Protocol("a mapping's descriptors did not match its answer".into());
    if h.len != m.len {
        return Err(mismatch());
    }
    let [memory_fd, grant_fd]: [OwnedFd; 2] = fds.try_into().map_err(|_| mismatch())?;
    let io = |e: std::io::Error| ClientError::Protocol(format!("mapping: {e}"));
    let grant = GrantView::open(grant_fd).map_err(io)?;
    let memory = if m.writable {
        Memory::Writable(SharedMemory::open(memory_fd, len).map_err(io)?)
    } else {
        Memory::ReadOnly(ReadOnlyMemory::open(memory_fd, len).map_err(io)?)
    };
    Ok((
        Lease {
            memory,
            grant,
            writable: m.writable,
        },
        len,
    ))
}

/// Shared memory between processes of one server: a region a process
/// lends its local peers ([`crate::Session::share`]) or borrows from one
/// ([`crate::Session::map_shared`]), made and lent by the daemon as its
/// access rules allow.
///
/// Every access is under the region's grant word (the protocol of
/// `uniplane_shm::grant`): once the daemon withdraws the region — a
/// borrower lost its grant or ended, or the owner's session ended — every
/// access reports [`Access::Revoked`] and the region stays withdrawn; the
/// owner keeps its bytes (its mapping is still its memory), a borrower
/// goes back to messages. A write that reports `Revoked` may or may not
/// have reached the owner's bytes: redo it another way.
pub struct SharedRegion {
    owner: Uid,
    id: u16,
    len: usize,
    lease: Lease,
}

impl std::fmt::Debug for SharedRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedRegion")
            .field("owner", &self.owner)
            .field("id", &self.id)
            .field("len", &self.len)
            .field("writable", &self.lease.writable)
            .finish()
    }
}

impl SharedRegion {
    pub(crate) async fn open(
        control: &ControlChannel,
        owner: Uid,
        id: u16,
        request: &Request,
    ) -> Result<SharedRegion, ClientError> {
        let (lease, len) = lease_for(control, request).await?;
        Ok(SharedRegion {
            owner,
            id,
            len,
            lease,
        })
    }

    /// The lending process.
    pub fn owner(&self) -> Uid {
        self.owner
    }

    /// Its number among the owner's regions.
    pub fn id(&self) -> u16 {
        self.id
    }

    /// Bytes of the region.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true: a region has at least one byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether this process may write it.
    pub fn writable(&self) -> bool {
        self.lease.writable
    }

    /// Whether the daemon has withdrawn it.
    pub fn is_withdrawn(&self) -> bool {
        self.lease.grant.is_revoked()
    }

    /// Writes `data` at `offset` under the grant: `Done`, `OutOfRange`
    /// (nothing written, also for a read-only mapping's every write) or
    /// `Revoked`.
    pub fn write(&self, offset: usize, data: &[u8]) -> Access {
        self.lease.write(offset, data)
    }

    /// Reads `dst.len()` bytes at `offset` under the grant.
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Access {
        self.lease.read(offset, dst)
    }

    /// The writable mapping itself, for an owner that keeps its own
    /// discipline over the bytes (checking [`SharedRegion::is_withdrawn`]
    /// after every access); `None` for a read-only one.
    pub fn memory(&self) -> Option<&SharedMemory> {
        match &self.lease.memory {
            Memory::Writable(m) => Some(m),
            Memory::ReadOnly(_) => None,
        }
    }
}
