//! One DPDK port as a frame device.

use std::ffi::CString;
use std::io;
use std::ptr;
use std::sync::atomic::{AtomicU32, Ordering};

use uniplane_frame::eth::{MacAddr, HEADER_LEN};
use uniplane_frame::{DeviceOpener, FrameDevice, FrameStats, RxQueue, TxQueue, Wakeup};

use crate::eal::{errno, error, Eal};
use crate::sys;

/// Frames per burst.
const BURST: usize = 32;

/// How a port is set up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DpdkConfig {
    /// Receive descriptors.
    pub rx_descriptors: u16,
    /// Transmit descriptors.
    pub tx_descriptors: u16,
    /// Mbufs in the port's pool (small pools fit `--no-huge -m 1024`).
    pub pool_mbufs: u32,
    /// Largest frame payload; the mbufs hold it with its header.
    pub mtu: usize,
    /// Accept frames for every MAC.
    pub promiscuous: bool,
}

impl Default for DpdkConfig {
    fn default() -> Self {
        DpdkConfig {
            rx_descriptors: 1024,
            tx_descriptors: 1024,
            pool_mbufs: 8191,
            mtu: 1500,
            promiscuous: true,
        }
    }
}

/// Receive side: the mbufs of the current burst, lent one at a time and
/// freed in bulk at the next refill.
pub struct DpdkRx {
    port: u16,
    mbufs: [*mut sys::rte_mbuf; BURST],
    data: [*mut u8; BURST],
    lens: [u16; BURST],
    count: usize,
    next: usize,
    stats: FrameStats,
}

// SAFETY: the mbufs belong to this queue until freed; DPDK allows any
// thread to use a queue as long as one thread does at a time (`&mut`).
unsafe impl Send for DpdkRx {}

impl RxQueue for DpdkRx {
    fn ready(&self) -> usize {
        self.count - self.next
    }

    fn refill(&mut self) -> io::Result<usize> {
        if self.next < self.count {
            return Ok(self.count - self.next);
        }
        if self.count > 0 {
            // SAFETY: the mbufs of the finished burst, each freed once.
            unsafe { sys::up_free_bulk(self.mbufs.as_mut_ptr(), self.count as u32) };
            self.count = 0;
            self.next = 0;
        }
        // SAFETY: room for BURST mbuf pointers.
        let n = unsafe { sys::up_rx_burst(self.port, 0, self.mbufs.as_mut_ptr(), BURST as u16) };
        if n > 0 {
            // SAFETY: n received mbufs; arrays of BURST entries.
            unsafe {
                sys::up_rx_frames(
                    self.mbufs.as_mut_ptr(),
                    n,
                    self.data.as_mut_ptr(),
                    self.lens.as_mut_ptr(),
                )
            };
            self.stats.rx_bursts += 1;
        }
        self.count = n as usize;
        Ok(self.count)
    }

    fn take<R>(&mut self, f: impl FnOnce(&mut [u8]) -> R) -> Option<R> {
        while self.next < self.count {
            let i = self.next;
            self.next += 1;
            let len = self.lens[i] as usize;
            if len == 0 {
                self.stats.rx_truncated += 1;
                continue;
            }
            // SAFETY: the mbuf's data segment, ours until the next refill.
            let frame = unsafe { std::slice::from_raw_parts_mut(self.data[i], len) };
            self.stats.rx_frames += 1;
            return Some(f(frame));
        }
        None
    }
}

impl Drop for DpdkRx {
    fn drop(&mut self) {
        if self.count > 0 {
            // SAFETY: the mbufs still held, freed once.
            unsafe { sys::up_free_bulk(self.mbufs.as_mut_ptr(), self.count as u32) };
        }
    }
}

/// Transmit side: mbufs taken from the pool in bulk, each reset and
/// written in place as its frame is pushed, sent in bursts; what the port
/// does not take waits for the next flush. One array holds them all, in
/// three runs:
///
/// ```text
///  mbufs: [ sent | written, waiting: sent..count | taken, free: count..avail | empty ]
/// ```
pub struct DpdkTx {
    port: u16,
    pool: *mut sys::rte_mempool,
    mbufs: [*mut sys::rte_mbuf; BURST],
    sent: usize,
    count: usize,
    avail: usize,
    capacity: usize,
    /// What a frame's reset writes, and where.
    layout: TxLayout,
    stats: FrameStats,
}

// SAFETY: as for `DpdkRx`.
unsafe impl Send for DpdkTx {}

/// Where a transmit's reset goes in `struct rte_mbuf`, read from the C
/// layout once (`up_tx_layout`). Resetting as the frame is written brings
/// the mbuf's first cache line in once per frame: under `--no-huge` every
/// mbuf of a pool sits at the same offset of its 4 KiB page, so a burst's
/// first lines share a few L1 sets and a separate reset pass had them
/// evicted again before the lengths were written.
#[derive(Clone, Copy, Debug)]
struct TxLayout {
    buf_addr: usize,
    data_off: usize,
    ol_flags: usize,
    packet_type: usize,
    pkt_len: usize,
    data_len: usize,
    vlan_tci: usize,
    headroom: u16,
    keep_flags: u64,
    /// packet_type (u32), pkt_len (u32), data_len (u16) and vlan_tci
    /// (u16) lie back to back, as in DPDK 22.11: one 8-byte and one
    /// 4-byte store set all four.
    packed: bool,
}

impl TxLayout {
    fn read() -> TxLayout {
        let mut off = [0usize; 7];
        let (mut headroom, mut keep_flags) = (0u16, 0u64);
        // SAFETY: seven out-slots and two out-pointers.
        unsafe { sys::up_tx_layout(off.as_mut_ptr(), &mut headroom, &mut keep_flags) };
        let [buf_addr, data_off, ol_flags, packet_type, pkt_len, data_len, vlan_tci] = off;
        TxLayout {
            buf_addr,
            data_off,
            ol_flags,
            packet_type,
            pkt_len,
            data_len,
            vlan_tci,
            headroom,
            keep_flags,
            packed: pkt_len == packet_type + 4
                && data_len == packet_type + 8
                && vlan_tci == packet_type + 10,
        }
    }

    /// Resets mbuf `m`, fresh from the pool, for transmission and returns
    /// where its frame goes: data_off to the headroom, ol_flags to no
    /// offload.
    ///
    /// # Safety
    /// `m` must be an mbuf of a pool whose buffers are longer than the
    /// headroom, taken by this queue and not yet sent.
    #[inline(always)]
    unsafe fn reset(self, m: *mut sys::rte_mbuf) -> *mut u8 {
        // SAFETY: the offsets come from the C layout of the fields.
        unsafe {
            let base = m.cast::<u8>();
            let buf = base.add(self.buf_addr).cast::<*mut u8>().read_unaligned();
            base.add(self.data_off)
                .cast::<u16>()
                .write_unaligned(self.headroom);
            let flags = base.add(self.ol_flags).cast::<u64>();
            flags.write_unaligned(flags.read_unaligned() & self.keep_flags);
            buf.add(self.headroom as usize)
        }
    }

    /// Sets the lengths of reset mbuf `m`, with packet_type and vlan_tci 0.
    ///
    /// # Safety
    /// As for [`TxLayout::reset`].
    #[inline(always)]
    unsafe fn set_len(self, m: *mut sys::rte_mbuf, len: usize) {
        // SAFETY: as in `reset`.
        unsafe {
            let base = m.cast::<u8>();
            if self.packed {
                let at = base.add(self.packet_type);
                at.cast::<u64>()
                    .write_unaligned(((len as u64) << 32).to_le());
                at.add(8)
                    .cast::<u32>()
                    .write_unaligned((len as u32).to_le());
            } else {
                base.add(self.packet_type).cast::<u32>().write_unaligned(0);
                base.add(self.pkt_len)
                    .cast::<u32>()
                    .write_unaligned(len as u32);
                base.add(self.data_len)
                    .cast::<u16>()
                    .write_unaligned(len as u16);
                base.add(self.vlan_tci).cast::<u16>().write_unaligned(0);
            }
        }
    }
}

impl DpdkTx {
    fn new(port: u16, pool: *mut sys::rte_mempool, capacity: usize) -> Self {
        DpdkTx {
            port,
            pool,
            mbufs: [ptr::null_mut(); BURST],
            sent: 0,
            count: 0,
            avail: 0,
            capacity,
            layout: TxLayout::read(),
            stats: FrameStats::default(),
        }
    }

    /// Makes free slots when every taken one is written: moves the
    /// waiting frames to the front and takes up to a full burst.
    #[cold]
    fn refill_slots(&mut self) -> bool {
        if self.sent > 0 {
            self.mbufs.copy_within(self.sent..self.count, 0);
            self.count -= self.sent;
            self.avail = self.count;
            self.sent = 0;
        }
        let want = BURST - self.avail;
        if want == 0 {
            return false;
        }
        // SAFETY: room for `want` pointers at `avail`; the pool outlives
        // the queue.
        let rc = unsafe {
            sys::up_get_bulk(
                self.pool,
                self.mbufs.as_mut_ptr().add(self.avail),
                want as u32,
            )
        };
        if rc != 0 {
            return false;
        }
        self.avail = BURST;
        true
    }
}

impl TxQueue for DpdkTx {
    fn frame_capacity(&self) -> usize {
        self.capacity
    }

    fn has_room(&mut self) -> bool {
        self.count < self.avail || self.refill_slots()
    }

    #[inline]
    fn push<R>(&mut self, len: usize, f: impl FnOnce(&mut [u8]) -> R) -> Option<R> {
        if len > self.capacity || !self.has_room() {
            return None;
        }
        let i = self.count;
        self.count = i + 1;
        let (m, at) = (self.mbufs[i], self.layout);
        // SAFETY: a taken mbuf, ours until sent, whose data room holds
        // `capacity` bytes after the headroom.
        unsafe {
            let data = at.reset(m);
            at.set_len(m, len);
            Some(f(std::slice::from_raw_parts_mut(data, len)))
        }
    }

    fn push_burst(&mut self, max: usize, mut f: impl FnMut(usize, &mut [u8]) -> usize) -> usize {
        let mut n = 0;
        let (cap, at) = (self.capacity, self.layout);
        while n < max && self.has_room() {
            let end = self.count.saturating_add(max - n).min(self.avail);
            let mut i = self.count;
            while i < end {
                let m = self.mbufs[i];
                // SAFETY: as in `push`.
                let len = unsafe {
                    let data = at.reset(m);
                    f(n, std::slice::from_raw_parts_mut(data, cap))
                }
                .min(cap);
                if len == 0 {
                    self.count = i;
                    return n;
                }
                // SAFETY: as in `push`.
                unsafe { at.set_len(m, len) };
                i += 1;
                n += 1;
            }
            self.count = i;
        }
        n
    }

    fn unflushed(&self) -> usize {
        self.count - self.sent
    }

    fn flush(&mut self) -> io::Result<usize> {
        let n = self.count - self.sent;
        if n == 0 {
            return Ok(0);
        }
        // SAFETY: the written mbufs, their lengths set as they were written.
        let took = unsafe {
            sys::up_tx_burst(
                self.port,
                0,
                self.mbufs.as_mut_ptr().add(self.sent),
                n as u16,
            )
        } as usize;
        self.sent += took;
        if self.sent == self.avail {
            self.sent = 0;
            self.count = 0;
            self.avail = 0;
        }
        if took > 0 {
            self.stats.tx_frames += took as u64;
            self.stats.tx_bursts += 1;
        }
        Ok(took)
    }
}

impl Drop for DpdkTx {
    fn drop(&mut self) {
        if self.avail > self.sent {
            // SAFETY: mbufs still owned here (written or spare), each freed once.
            unsafe {
                sys::up_free_bulk(
                    self.mbufs.as_mut_ptr().add(self.sent),
                    (self.avail - self.sent) as u32,
                )
            };
        }
    }
}

/// One started DPDK port with one receive and one transmit queue.
pub struct DpdkDevice {
    rx: DpdkRx,
    tx: DpdkTx,
    port: u16,
    pool: *mut sys::rte_mempool,
    mac: MacAddr,
    mtu: usize,
}

// SAFETY: the pool and the port are used through `&mut` only.
unsafe impl Send for DpdkDevice {}

static POOLS: AtomicU32 = AtomicU32::new(0);

impl DpdkDevice {
    /// Configures and starts the port called `name` (a vdev such as
    /// `net_ring0`, or a PCI address) with one queue pair.
    pub fn open(_eal: &'static Eal, name: &str, cfg: &DpdkConfig) -> io::Result<DpdkDevice> {
        let cname = CString::new(name).map_err(io::Error::other)?;
        let mut port = 0u16;
        // SAFETY: a valid C string and an out-pointer.
        let rc = unsafe { sys::rte_eth_dev_get_port_by_name(cname.as_ptr(), &mut port) };
        if rc != 0 {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("no DPDK port named {name}"),
            ));
        }
        // SAFETY: a port DPDK knows.
        let socket = unsafe { sys::rte_eth_dev_socket_id(port) }.max(0);
        let room = (HEADER_LEN + cfg.mtu + 128).max(2048) as u16;
        let pool_name = CString::new(format!(
            "up{}p{}",
            POOLS.fetch_add(1, Ordering::Relaxed),
            port
        ))
        .map_err(io::Error::other)?;
        // SAFETY: creating a pool with a unique name.
        let pool = unsafe {
            sys::rte_pktmbuf_pool_create(
                pool_name.as_ptr(),
                cfg.pool_mbufs,
                256,
                0,
                room + 128,
                socket,
            )
        };
        if pool.is_null() {
            return Err(error("rte_pktmbuf_pool_create", errno()));
        }
        let fail = |what: &str, rc: i32| {
            // SAFETY: the pool was created above and nothing uses it yet.
            unsafe { sys::rte_mempool_free(pool) };
            error(what, -rc)
        };
        let conf = sys::rte_eth_conf::default();
        // SAFETY: configuring a known port with one queue each way.
        let rc = unsafe { sys::rte_eth_dev_configure(port, 1, 1, &conf) };
        if rc != 0 {
            return Err(fail("rte_eth_dev_configure", rc));
        }
        // SAFETY: queue 0 of a configured port, default queue settings.
        let rc = unsafe {
            sys::rte_eth_rx_queue_setup(
                port,
                0,
                cfg.rx_descriptors,
                socket as u32,
                ptr::null(),
                pool,
            )
        };
        if rc != 0 {
            return Err(fail("rte_eth_rx_queue_setup", rc));
        }
        // SAFETY: as above.
        let rc = unsafe {
            sys::rte_eth_tx_queue_setup(port, 0, cfg.tx_descriptors, socket as u32, ptr::null())
        };
        if rc != 0 {
            return Err(fail("rte_eth_tx_queue_setup", rc));
        }
        // SAFETY: a configured port.
        let rc = unsafe { sys::rte_eth_dev_start(port) };
        if rc != 0 {
            return Err(fail("rte_eth_dev_start", rc));
        }
        if cfg.promiscuous {
            // SAFETY: a started port; vdevs may refuse, which is harmless.
            unsafe { sys::rte_eth_promiscuous_enable(port) };
        }
        let mut addr = sys::rte_ether_addr::default();
        // SAFETY: an out-pointer to a live address.
        unsafe { sys::rte_eth_macaddr_get(port, &mut addr) };
        // SAFETY: a pool of this crate.
        let capacity = (unsafe { sys::up_data_room(pool) } as usize).min(HEADER_LEN + cfg.mtu);
        Ok(DpdkDevice {
            rx: DpdkRx {
                port,
                mbufs: [ptr::null_mut(); BURST],
                data: [ptr::null_mut(); BURST],
                lens: [0; BURST],
                count: 0,
                next: 0,
                stats: FrameStats::default(),
            },
            tx: DpdkTx::new(port, pool, capacity),
            port,
            pool,
            mac: MacAddr(addr.addr_bytes),
            mtu: cfg.mtu,
        })
    }

    /// The port id.
    pub fn port_id(&self) -> u16 {
        self.port
    }

    /// The port's own counters (packets and drops as the driver saw them).
    pub fn port_stats(&self) -> (u64, u64, u64, u64) {
        let mut s = sys::rte_eth_stats::default();
        // SAFETY: an out-pointer to live stats.
        unsafe { sys::rte_eth_stats_get(self.port, &mut s) };
        (s.ipackets, s.opackets, s.imissed, s.oerrors)
    }
}

impl Drop for DpdkDevice {
    fn drop(&mut self) {
        // Mbufs held by the queues go back first (their Drop runs after
        // this body, so free them here by swapping in empty queues).
        let rx = std::mem::replace(
            &mut self.rx,
            DpdkRx {
                port: self.port,
                mbufs: [ptr::null_mut(); BURST],
                data: [ptr::null_mut(); BURST],
                lens: [0; BURST],
                count: 0,
                next: 0,
                stats: FrameStats::default(),
            },
        );
        drop(rx);
        let pool = self.pool;
        let tx = std::mem::replace(&mut self.tx, DpdkTx::new(self.port, pool, 0));
        drop(tx);
        // SAFETY: the port stops and closes; its queues released their
        // mbufs; then the pool is free.
        unsafe {
            sys::rte_eth_dev_stop(self.port);
            sys::rte_eth_dev_close(self.port);
            sys::rte_mempool_free(self.pool);
        }
    }
}

impl FrameDevice for DpdkDevice {
    type Rx = DpdkRx;
    type Tx = DpdkTx;

    fn queues(&mut self) -> (&mut DpdkRx, &mut DpdkTx) {
        (&mut self.rx, &mut self.tx)
    }

    fn mac(&self) -> MacAddr {
        self.mac
    }

    fn mtu(&self) -> usize {
        self.mtu
    }

    fn wakeup(&self) -> Wakeup {
        Wakeup::Poll
    }

    fn stats(&self) -> FrameStats {
        let (r, t) = (&self.rx.stats, &self.tx.stats);
        FrameStats {
            rx_frames: r.rx_frames,
            rx_bursts: r.rx_bursts,
            rx_truncated: r.rx_truncated,
            tx_frames: t.tx_frames,
            tx_bursts: t.tx_bursts,
            ..FrameStats::default()
        }
    }
}

/// Opens DPDK ports by name for the stacks, initialising the EAL with
/// `eal_args` on first use.
#[derive(Clone, Debug, Default)]
pub struct DpdkOpener {
    /// EAL arguments, as on a DPDK command line.
    pub eal_args: Vec<String>,
    /// How each port is set up.
    pub config: DpdkConfig,
}

impl DeviceOpener for DpdkOpener {
    type Device = DpdkDevice;

    fn open(&self, iface: &str, _ethertype: u16) -> io::Result<DpdkDevice> {
        let args: Vec<&str> = self.eal_args.iter().map(String::as_str).collect();
        let eal = Eal::init(&args)?;
        DpdkDevice::open(eal, iface, &self.config)
    }
}
