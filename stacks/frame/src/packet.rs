//! `AF_PACKET` with memory-mapped rings: the kernel writes received frames
//! into a `TPACKET_V3` receive ring of blocks, and takes transmitted
//! frames from a `TPACKET_V3` transmit ring, both in one mapping shared
//! with the kernel.
//!
//! ```text
//!  mmap: [ RX block 0 | RX block 1 | … ][ TX slot 0 | TX slot 1 | … ]
//!          kernel fills a block with many   we write frames in place,
//!          frames, retires it (full or       mark them SEND_REQUEST;
//!          after `rx_block_timeout`); we     one sendto(NULL) sends all;
//!          read them in place and hand       the kernel marks each slot
//!          the block back                    AVAILABLE once the frame left
//! ```
//!
//! **Why a transmit ring and not `sendmmsg`.** Both make one system call
//! per burst. With `sendmmsg` the kernel parses a `msghdr` and copies each
//! frame from user memory into a new buffer; with the ring the frames are
//! already in memory the kernel maps, it builds each packet around the
//! ring's pages without a copy, and the call carries no per-frame
//! arguments. netsniff-ng's trafgen uses the same ring, which makes the
//! comparison with it direct.
//!
//! Receive costs no system call at all: a block's status word says when
//! the kernel handed it over. A block is retired when full or after
//! `rx_block_timeout_ms`, which bounds the latency a lightly loaded link
//! adds (1 ms by default).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::eth::{self, MacAddr};
use crate::sys::{self, cvt, setsockopt};
use crate::{FrameDevice, FrameStats, RxQueue, TxQueue, Wakeup};

/// Receive every protocol (`ETH_P_ALL`).
pub const ETH_P_ALL: u16 = libc::ETH_P_ALL as u16;

use libc::{
    PACKET_ADD_MEMBERSHIP, PACKET_FANOUT, PACKET_IGNORE_OUTGOING, PACKET_LOSS, PACKET_QDISC_BYPASS,
    PACKET_RX_RING, PACKET_STATISTICS, PACKET_TX_RING, PACKET_VERSION, SOL_PACKET,
    TP_STATUS_AVAILABLE, TP_STATUS_CSUMNOTREADY, TP_STATUS_KERNEL, TP_STATUS_LOSING,
    TP_STATUS_SEND_REQUEST, TP_STATUS_USER, TP_STATUS_WRONG_FORMAT,
};

/// Offsets in the ring's headers (`linux/if_packet.h`), taken from the
/// declarations in `libc`.
mod layout {
    use std::mem::{offset_of, size_of};

    use libc::{tpacket3_hdr, tpacket_block_desc, tpacket_hdr_v1};

    /// `tpacket_block_desc`: `version`, `offset_to_priv`, then
    /// `tpacket_hdr_v1`.
    const BLOCK_HDR: usize = offset_of!(tpacket_block_desc, hdr);
    pub const BLOCK_STATUS: usize = BLOCK_HDR + offset_of!(tpacket_hdr_v1, block_status);
    pub const BLOCK_NUM_PKTS: usize = BLOCK_HDR + offset_of!(tpacket_hdr_v1, num_pkts);
    pub const BLOCK_FIRST_PKT: usize = BLOCK_HDR + offset_of!(tpacket_hdr_v1, offset_to_first_pkt);
    /// `tpacket3_hdr`.
    pub const NEXT_OFFSET: usize = offset_of!(tpacket3_hdr, tp_next_offset);
    pub const SNAPLEN: usize = offset_of!(tpacket3_hdr, tp_snaplen);
    pub const LEN: usize = offset_of!(tpacket3_hdr, tp_len);
    pub const STATUS: usize = offset_of!(tpacket3_hdr, tp_status);
    pub const MAC: usize = offset_of!(tpacket3_hdr, tp_mac);
    /// `TPACKET_ALIGN(sizeof(struct tpacket3_hdr))`: where a transmitted
    /// frame starts in its slot (`TPACKET3_HDRLEN` less the address the
    /// kernel reserves only on receive).
    pub const TX_DATA: usize = libc::TPACKET3_HDRLEN - size_of::<libc::sockaddr_ll>();

    #[cfg(test)]
    mod tests {
        /// The offsets the ring code was written against, as the kernel
        /// headers give them.
        #[test]
        fn offsets_are_the_kernel_headers() {
            assert_eq!(
                (
                    super::BLOCK_STATUS,
                    super::BLOCK_NUM_PKTS,
                    super::BLOCK_FIRST_PKT
                ),
                (8, 12, 16)
            );
            assert_eq!(
                (
                    super::NEXT_OFFSET,
                    super::SNAPLEN,
                    super::LEN,
                    super::STATUS,
                    super::MAC
                ),
                (0, 12, 16, 20, 24)
            );
            assert_eq!(super::TX_DATA, 48);
        }
    }
}

/// How the kernel spreads frames over the sockets of a fanout group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FanoutMode {
    /// By flow hash: a flow stays on one socket.
    Hash = libc::PACKET_FANOUT_HASH as isize,
    /// Round robin.
    LoadBalance = libc::PACKET_FANOUT_LB as isize,
    /// By the CPU that received the frame.
    Cpu = libc::PACKET_FANOUT_CPU as isize,
}

/// A fanout group: sockets of one group share the interface's frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fanout {
    /// Group id, the same for every member.
    pub group: u16,
    /// Spreading policy.
    pub mode: FanoutMode,
}

/// One classic-BPF instruction, laid out as `libc::sock_filter` (which the
/// kernel is handed) but comparable and printable.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BpfInsn {
    /// Operation.
    pub code: u16,
    /// Jump offset if true.
    pub jt: u8,
    /// Jump offset if false.
    pub jf: u8,
    /// Operand.
    pub k: u32,
}

/// A filter that accepts only frames from `src` (the kernel then
/// demultiplexes by peer, as it does for a connected UDP socket).
pub fn src_mac_filter(src: MacAddr) -> Vec<BpfInsn> {
    const LDH_ABS: u16 = (libc::BPF_LD | libc::BPF_H | libc::BPF_ABS) as u16;
    const LDW_ABS: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
    const JEQ_K: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
    const RET_K: u16 = (libc::BPF_RET | libc::BPF_K) as u16;
    let m = src.0;
    let hi = u16::from_be_bytes([m[0], m[1]]) as u32;
    let lo = u32::from_be_bytes([m[2], m[3], m[4], m[5]]);
    let i = |code, jt, jf, k| BpfInsn { code, jt, jf, k };
    vec![
        i(LDH_ABS, 0, 0, 6),
        i(JEQ_K, 0, 3, hi),
        i(LDW_ABS, 0, 0, 8),
        i(JEQ_K, 0, 1, lo),
        i(RET_K, 0, 0, 0x0004_0000),
        i(RET_K, 0, 0, 0),
    ]
}

/// How to open a packet socket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PacketConfig {
    /// EtherType to receive ([`ETH_P_ALL`] for every one).
    pub protocol: u16,
    /// Size of a receive block; a frame must fit in one (a kernel peer on
    /// a veth may hand over 64 KiB segments, so 256 KiB by default).
    pub rx_block_size: usize,
    /// Receive blocks in the ring.
    pub rx_blocks: usize,
    /// Milliseconds after which a block that holds frames is handed over
    /// even if not full.
    pub rx_block_timeout_ms: u32,
    /// Transmit slots in the ring.
    pub tx_frames: usize,
    /// Largest frame payload to transmit; `None` takes the interface's MTU.
    pub mtu: Option<usize>,
    /// Join a fanout group.
    pub fanout: Option<Fanout>,
    /// Send straight to the driver, skipping the qdisc layer.
    pub qdisc_bypass: bool,
    /// Put the interface in promiscuous mode while the socket is open
    /// (needed on a real NIC to see frames for other MACs, as smoltcp's).
    pub promiscuous: bool,
    /// A classic-BPF program run on every frame before it enters the ring.
    pub filter: Option<Vec<BpfInsn>>,
}

impl Default for PacketConfig {
    fn default() -> Self {
        PacketConfig {
            protocol: ETH_P_ALL,
            rx_block_size: 256 << 10,
            rx_blocks: 32,
            rx_block_timeout_ms: 1,
            tx_frames: 1024,
            mtu: None,
            fanout: None,
            qdisc_bypass: true,
            promiscuous: false,
            filter: None,
        }
    }
}

/// A shared mapping of both rings.
struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain shared memory owned by one device.
unsafe impl Send for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the region was mapped with this length and nothing
        // borrows it any more (the queues are dropped with the device).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// The status word of a ring header at `p`.
///
/// # Safety
/// `p` must point at a live, 4-byte aligned header of the mapping.
unsafe fn status<'a>(p: *mut u8) -> &'a AtomicU32 {
    unsafe { &*(p as *const AtomicU32) }
}

/// # Safety
/// `p + at` must be a readable, aligned `u32` of the mapping.
unsafe fn read_u32(p: *const u8, at: usize) -> u32 {
    unsafe { (p.add(at) as *const u32).read_volatile() }
}

/// The receive ring.
pub struct PacketRx {
    base: *mut u8,
    block_size: usize,
    blocks: usize,
    block: usize,
    /// Whether `block` is ours (handed over by the kernel).
    owned: bool,
    remaining: u32,
    offset: usize,
    stats: FrameStats,
}

// SAFETY: the ring memory is owned by the device and only reached through
// `&mut` to this queue.
unsafe impl Send for PacketRx {}

impl PacketRx {
    fn block_ptr(&self) -> *mut u8 {
        // SAFETY: block < blocks, inside the mapping.
        unsafe { self.base.add(self.block * self.block_size) }
    }
}

impl RxQueue for PacketRx {
    fn ready(&self) -> usize {
        self.remaining as usize
    }

    fn refill(&mut self) -> io::Result<usize> {
        if self.remaining > 0 {
            return Ok(self.remaining as usize);
        }
        if self.owned {
            // SAFETY: the block header lies in the mapping.
            unsafe { status(self.block_ptr().add(layout::BLOCK_STATUS)) }
                .store(TP_STATUS_KERNEL, Ordering::Release);
            self.owned = false;
            self.block = (self.block + 1) % self.blocks;
        }
        let b = self.block_ptr();
        // SAFETY: the block header lies in the mapping.
        let st = unsafe { status(b.add(layout::BLOCK_STATUS)) }.load(Ordering::Acquire);
        if st & TP_STATUS_USER == 0 {
            return Ok(0);
        }
        self.owned = true;
        // SAFETY: the kernel handed the block over; its header is valid.
        unsafe {
            self.remaining = read_u32(b, layout::BLOCK_NUM_PKTS);
            self.offset = read_u32(b, layout::BLOCK_FIRST_PKT) as usize;
        }
        if st & TP_STATUS_LOSING != 0 {
            self.stats.rx_dropped += 1;
        }
        self.stats.rx_bursts += 1;
        Ok(self.remaining as usize)
    }

    fn take<R>(&mut self, f: impl FnOnce(&mut [u8]) -> R) -> Option<R> {
        while self.remaining > 0 {
            let b = self.block_ptr();
            if self.offset + layout::TX_DATA > self.block_size {
                // A header the kernel never wrote: give the block up.
                self.remaining = 0;
                return None;
            }
            // SAFETY: offsets inside an owned block, as the kernel wrote them.
            let (next, snaplen, len, st, mac) = unsafe {
                let h = b.add(self.offset);
                (
                    read_u32(h, layout::NEXT_OFFSET) as usize,
                    read_u32(h, layout::SNAPLEN) as usize,
                    read_u32(h, layout::LEN) as usize,
                    read_u32(h, layout::STATUS),
                    (h.add(layout::MAC) as *const u16).read_volatile() as usize,
                )
            };
            let at = self.offset + mac;
            self.remaining -= 1;
            self.offset += next;
            if snaplen < len || at + snaplen > self.block_size {
                self.stats.rx_truncated += 1;
                continue;
            }
            // SAFETY: the frame lies inside the owned block, which nobody
            // else touches until we hand it back.
            let frame = unsafe { std::slice::from_raw_parts_mut(b.add(at), snaplen) };
            if st & TP_STATUS_CSUMNOTREADY != 0 && eth::complete_l4_checksum(frame) {
                self.stats.rx_csum_completed += 1;
            }
            self.stats.rx_frames += 1;
            return Some(f(frame));
        }
        None
    }
}

/// The transmit ring.
pub struct PacketTx {
    fd: RawFd,
    base: *mut u8,
    slot_size: usize,
    slots: usize,
    next: usize,
    unflushed: usize,
    capacity: usize,
    stats: FrameStats,
}

// SAFETY: as for `PacketRx`.
unsafe impl Send for PacketTx {}

impl PacketTx {
    fn slot(&self, i: usize) -> *mut u8 {
        // SAFETY: i < slots, inside the mapping.
        unsafe { self.base.add(i * self.slot_size) }
    }
}

impl TxQueue for PacketTx {
    fn frame_capacity(&self) -> usize {
        self.capacity
    }

    fn has_room(&mut self) -> bool {
        // SAFETY: the slot header lies in the mapping.
        let st = unsafe { status(self.slot(self.next).add(layout::STATUS)) };
        match st.load(Ordering::Acquire) {
            TP_STATUS_AVAILABLE => true,
            TP_STATUS_WRONG_FORMAT => {
                self.stats.tx_errors += 1;
                st.store(TP_STATUS_AVAILABLE, Ordering::Relaxed);
                true
            }
            _ => false,
        }
    }

    fn push<R>(&mut self, len: usize, f: impl FnOnce(&mut [u8]) -> R) -> Option<R> {
        if len > self.capacity || !self.has_room() {
            return None;
        }
        let h = self.slot(self.next);
        // SAFETY: the slot is AVAILABLE, so ours until marked; data and
        // header fields lie inside it.
        let r = unsafe {
            let data = std::slice::from_raw_parts_mut(h.add(layout::TX_DATA), len);
            let r = f(data);
            (h.add(layout::NEXT_OFFSET) as *mut u32).write_volatile(0);
            (h.add(layout::SNAPLEN) as *mut u32).write_volatile(len as u32);
            (h.add(layout::LEN) as *mut u32).write_volatile(len as u32);
            status(h.add(layout::STATUS)).store(TP_STATUS_SEND_REQUEST, Ordering::Release);
            r
        };
        self.next = (self.next + 1) % self.slots;
        self.unflushed += 1;
        Some(r)
    }

    fn push_burst(&mut self, max: usize, mut f: impl FnMut(usize, &mut [u8]) -> usize) -> usize {
        let mut n = 0;
        while n < max && self.has_room() {
            let h = self.slot(self.next);
            // SAFETY: as in `push`: an AVAILABLE slot is ours until marked.
            let len = unsafe {
                let data = std::slice::from_raw_parts_mut(h.add(layout::TX_DATA), self.capacity);
                f(n, data).min(self.capacity)
            };
            if len == 0 {
                break;
            }
            // SAFETY: header fields of the same slot.
            unsafe {
                (h.add(layout::NEXT_OFFSET) as *mut u32).write_volatile(0);
                (h.add(layout::SNAPLEN) as *mut u32).write_volatile(len as u32);
                (h.add(layout::LEN) as *mut u32).write_volatile(len as u32);
                status(h.add(layout::STATUS)).store(TP_STATUS_SEND_REQUEST, Ordering::Release);
            }
            self.next = (self.next + 1) % self.slots;
            self.unflushed += 1;
            n += 1;
        }
        n
    }

    fn unflushed(&self) -> usize {
        self.unflushed
    }

    fn flush(&mut self) -> io::Result<usize> {
        if self.unflushed == 0 {
            return Ok(0);
        }
        // SAFETY: a send of nothing: the kernel takes the frames from the ring.
        let rc = unsafe {
            libc::sendto(
                self.fd,
                std::ptr::null(),
                0,
                libc::MSG_DONTWAIT,
                std::ptr::null(),
                0,
            )
        };
        let err = (rc < 0).then(io::Error::last_os_error);
        // Frames the kernel has not taken yet are still SEND_REQUEST: the
        // newest ones, since it takes them in order.
        let mut left = 0;
        for back in 1..=self.unflushed {
            let i = (self.next + self.slots - back) % self.slots;
            // SAFETY: the slot header lies in the mapping.
            let st = unsafe { status(self.slot(i).add(layout::STATUS)) }.load(Ordering::Acquire);
            if st != TP_STATUS_SEND_REQUEST {
                break;
            }
            left += 1;
        }
        let sent = self.unflushed - left;
        self.unflushed = left;
        self.stats.tx_frames += sent as u64;
        if sent > 0 {
            self.stats.tx_bursts += 1;
        }
        match err {
            Some(e) if sys::would_block(&e) => Ok(sent),
            Some(e) => Err(e),
            None => Ok(sent),
        }
    }
}

/// A packet socket bound to one interface, with both rings mapped.
pub struct PacketDevice {
    // Field order matters: the queues point into the mapping, which is
    // unmapped before the socket closes.
    rx: PacketRx,
    tx: PacketTx,
    _map: Mapping,
    fd: OwnedFd,
    mac: MacAddr,
    mtu: usize,
    ifindex: i32,
    kernel_drops: AtomicU64,
}

fn round_up(v: usize, to: usize) -> usize {
    v.div_ceil(to) * to
}

impl PacketDevice {
    /// Opens a packet socket on `iface` as `cfg` says. Needs CAP_NET_RAW.
    pub fn open(iface: &str, cfg: &PacketConfig) -> io::Result<PacketDevice> {
        let ifindex = sys::ifindex(iface)?;
        let mac = sys::if_mac(iface)?;
        let mtu = match cfg.mtu {
            Some(m) => m,
            None => sys::if_mtu(iface)?,
        };
        // Protocol 0 receives nothing until `bind` names the real one, so
        // no frame of another interface slips in while the rings are set up.
        // SAFETY: plain socket creation.
        let raw =
            cvt(unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) })?;
        // SAFETY: a descriptor we just created and own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        setsockopt(
            raw,
            SOL_PACKET,
            PACKET_VERSION,
            &(libc::tpacket_versions::TPACKET_V3 as libc::c_int),
        )?;
        // Frames this host sends are not received back (kernel >= 4.20).
        let _ = setsockopt(raw, SOL_PACKET, PACKET_IGNORE_OUTGOING, &1i32);
        // A malformed frame in the transmit ring is skipped, not a stall.
        setsockopt(raw, SOL_PACKET, PACKET_LOSS, &1i32)?;
        if cfg.qdisc_bypass {
            setsockopt(raw, SOL_PACKET, PACKET_QDISC_BYPASS, &1i32)?;
        }
        if let Some(prog) = &cfg.filter {
            let fprog = libc::sock_fprog {
                len: prog.len() as u16,
                filter: prog.as_ptr() as *mut libc::sock_filter,
            };
            setsockopt(raw, libc::SOL_SOCKET, libc::SO_ATTACH_FILTER, &fprog)?;
        }

        let page = 4096;
        let rx_block = round_up(cfg.rx_block_size.max(page), page);
        let rx_blocks = cfg.rx_blocks.max(2);
        let nominal = 2048usize;
        let rx_req = ring_req(rx_block, rx_blocks, nominal, cfg.rx_block_timeout_ms.max(1));
        setsockopt(raw, SOL_PACKET, PACKET_RX_RING, &rx_req)?;

        let capacity = eth::HEADER_LEN + mtu;
        let slot = (layout::TX_DATA + capacity).next_power_of_two().max(2048);
        let tx_block = slot.max(page);
        let per_block = tx_block / slot;
        let tx_blocks = cfg.tx_frames.max(per_block).div_ceil(per_block);
        let tx_req = ring_req(tx_block, tx_blocks, slot, 0);
        setsockopt(raw, SOL_PACKET, PACKET_TX_RING, &tx_req)?;

        let rx_len = rx_block * rx_blocks;
        let len = rx_len + tx_block * tx_blocks;
        // SAFETY: mapping the rings the kernel just allocated for `raw`.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                raw,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let map = Mapping {
            ptr: NonNull::new(p.cast()).ok_or_else(|| io::Error::other("mmap returned null"))?,
            len,
        };
        let base = map.ptr.as_ptr();

        // SAFETY: all-zero is a valid sockaddr_ll.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = cfg.protocol.to_be();
        sll.sll_ifindex = ifindex;
        // SAFETY: binding to a valid sockaddr_ll of the declared size.
        cvt(unsafe {
            libc::bind(
                raw,
                (&sll as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        })?;
        if cfg.promiscuous {
            let mreq = libc::packet_mreq {
                mr_ifindex: ifindex,
                mr_type: libc::PACKET_MR_PROMISC as u16,
                mr_alen: 0,
                mr_address: [0; 8],
            };
            setsockopt(raw, SOL_PACKET, PACKET_ADD_MEMBERSHIP, &mreq)?;
        }
        if let Some(f) = cfg.fanout {
            let arg: u32 = f.group as u32 | ((f.mode as u32) << 16);
            setsockopt(raw, SOL_PACKET, PACKET_FANOUT, &arg)?;
        }

        Ok(PacketDevice {
            rx: PacketRx {
                base,
                block_size: rx_block,
                blocks: rx_blocks,
                block: 0,
                owned: false,
                remaining: 0,
                offset: 0,
                stats: FrameStats::default(),
            },
            tx: PacketTx {
                fd: raw,
                // SAFETY: the TX ring follows the RX ring in the mapping.
                base: unsafe { base.add(rx_len) },
                slot_size: slot,
                slots: tx_blocks * per_block,
                next: 0,
                unflushed: 0,
                capacity,
                stats: FrameStats::default(),
            },
            _map: map,
            fd,
            mac,
            mtu,
            ifindex,
            kernel_drops: AtomicU64::new(0),
        })
    }

    /// The interface index.
    pub fn ifindex(&self) -> i32 {
        self.ifindex
    }
}

impl AsRawFd for PacketDevice {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

// The kernel reads a filter program as `sock_filter`s.
const _: () = assert!(
    std::mem::size_of::<BpfInsn>() == std::mem::size_of::<libc::sock_filter>()
        && std::mem::align_of::<BpfInsn>() == std::mem::align_of::<libc::sock_filter>()
);

/// A `tpacket_req3` for a ring.
fn ring_req(
    block_size: usize,
    blocks: usize,
    frame_size: usize,
    retire_ms: u32,
) -> libc::tpacket_req3 {
    libc::tpacket_req3 {
        tp_block_size: block_size as u32,
        tp_block_nr: blocks as u32,
        tp_frame_size: frame_size as u32,
        tp_frame_nr: (block_size / frame_size * blocks) as u32,
        tp_retire_blk_tov: retire_ms,
        tp_sizeof_priv: 0,
        tp_feature_req_word: 0,
    }
}

impl FrameDevice for PacketDevice {
    type Rx = PacketRx;
    type Tx = PacketTx;

    fn queues(&mut self) -> (&mut PacketRx, &mut PacketTx) {
        (&mut self.rx, &mut self.tx)
    }

    fn mac(&self) -> MacAddr {
        self.mac
    }

    fn mtu(&self) -> usize {
        self.mtu
    }

    fn wakeup(&self) -> Wakeup {
        Wakeup::Fd(self.fd.as_raw_fd())
    }

    fn stats(&self) -> FrameStats {
        let mut st = libc::tpacket_stats_v3 {
            tp_packets: 0,
            tp_drops: 0,
            tp_freeze_q_cnt: 0,
        };
        let mut len = std::mem::size_of::<libc::tpacket_stats_v3>() as libc::socklen_t;
        // SAFETY: reading into a live struct of the declared size. The
        // kernel resets its counters on every read, so they accumulate here.
        let rc = unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                SOL_PACKET,
                PACKET_STATISTICS,
                (&mut st as *mut libc::tpacket_stats_v3).cast(),
                &mut len,
            )
        };
        if rc == 0 {
            self.kernel_drops
                .fetch_add(st.tp_drops as u64, Ordering::Relaxed);
        }
        let (r, t) = (&self.rx.stats, &self.tx.stats);
        FrameStats {
            rx_frames: r.rx_frames,
            rx_bursts: r.rx_bursts,
            rx_truncated: r.rx_truncated,
            rx_csum_completed: r.rx_csum_completed,
            rx_dropped: self.kernel_drops.load(Ordering::Relaxed),
            tx_frames: t.tx_frames,
            tx_bursts: t.tx_bursts,
            tx_errors: t.tx_errors,
        }
    }
}
