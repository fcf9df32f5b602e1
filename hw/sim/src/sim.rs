//! A safe, cycle-by-cycle handle on one Verilator model of `uniplane_top`.

use std::ffi::{c_int, c_uint, c_void};

use crate::ffi::{self, ModelFns};

/// Which model (parameter set) of `uniplane_top` to simulate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Model {
    /// 4 overlay ports, 64-beat virtual output queues, 2 underlay stacks.
    N4,
    /// 8 overlay ports, 32-beat virtual output queues, 2 underlay stacks.
    N8,
    /// [`Model::N4`] with the other crossbar (`MATCH = 1`): two read ports
    /// per input buffer instead of one per output, and an iSLIP-style
    /// matcher (`up_match`, two iterations) pairing inputs with a free
    /// read port with free outputs a whole message at a time, each
    /// output's grant made by its own scheduler. The second port is the
    /// speedup that keeps the outputs busy under saturation.
    N4Islip,
    /// [`Model::N8`] with the iSLIP crossbar of [`Model::N4Islip`] (two
    /// read ports per input, two iterations).
    N8Islip,
    /// [`Model::N8`] with kernels on two of its ports
    /// (`hw/rtl/kernels/up_top_kernels.v`): the echo kernel on
    /// [`Model::ECHO_PORT`], the sum32 kernel on [`Model::SUM32_PORT`].
    /// What the crossbar sends those ports goes to the kernel, and the
    /// kernel's answers enter the port's connector like a device's
    /// messages; the host side of those ports carries nothing, so ports
    /// 0 to 5 are the host's.
    N8Kernels,
}

impl Model {
    fn fns(self) -> ModelFns {
        match self {
            Model::N4 => ffi::N4,
            Model::N4Islip => ffi::N4I,
            Model::N8Islip => ffi::N8I,
            Model::N8 => ffi::N8,
            Model::N8Kernels => ffi::K8,
        }
    }

    /// The port of [`Model::N8Kernels`] the echo kernel sits on.
    pub const ECHO_PORT: usize = 6;

    /// The port of [`Model::N8Kernels`] the sum32 kernel sits on.
    pub const SUM32_PORT: usize = 7;

    /// The ports of this model's kernels, `(echo, sum32)`; `None` for a
    /// model without kernels.
    pub fn kernel_ports(self) -> Option<(usize, usize)> {
        match self {
            Model::N8Kernels => Some((Model::ECHO_PORT, Model::SUM32_PORT)),
            Model::N4 | Model::N4Islip | Model::N8 | Model::N8Islip => None,
        }
    }

    /// Beats each virtual output queue of this model may always hold; the
    /// queues of an input share [`Model::voq_pool`] beats more.
    pub fn voq_depth(self) -> usize {
        match self {
            Model::N4 | Model::N4Islip => 64,
            Model::N8 | Model::N8Islip | Model::N8Kernels => 32,
        }
    }

    /// The crossbar's matching iterations per cycle: `None` for the
    /// crossbar with a read port per output (no matching), as the ID
    /// block's `CROSSBAR` register says.
    pub fn match_iterations(self) -> Option<u32> {
        match self {
            Model::N4Islip | Model::N8Islip => Some(2),
            Model::N4 | Model::N8 | Model::N8Kernels => None,
        }
    }

    /// Read ports of each input's buffer: one per output without matching,
    /// as the ID block's `CROSSBAR` register says (bits 23:16 with
    /// matching).
    pub fn read_ports(self) -> usize {
        match self {
            Model::N4Islip | Model::N8Islip => 2,
            Model::N4 => 4,
            Model::N8 | Model::N8Kernels => 8,
        }
    }

    /// Beats of each input's buffer that its virtual output queues share
    /// beyond their reserves.
    pub fn voq_pool(self) -> usize {
        768
    }
}

/// A group of streams of the top level.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stream {
    /// The overlay ports (`s_axis_*` in, `m_axis_*` out).
    Port,
    /// The underlay's stack side (`stk_s_axis_*` in, `stk_m_axis_*` out).
    Stack,
    /// The underlay's interface side (`if_s_axis_*` in, `if_m_axis_*` out).
    Interface,
}

impl Stream {
    fn code(self) -> c_int {
        match self {
            Stream::Port => 0,
            Stream::Stack => 1,
            Stream::Interface => 2,
        }
    }
}

/// One 256-bit beat with its framing bits. `data[0]` is the byte sent
/// first (bits 255..248 of the RTL's vector).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Beat {
    /// The 32 bytes, in wire order.
    pub data: [u8; 32],
    /// First beat of a message.
    pub first: bool,
    /// Last beat of a message.
    pub last: bool,
}

impl Beat {
    fn to_words(self) -> [u32; 8] {
        let mut w = [0u32; 8];
        for (i, word) in w.iter_mut().enumerate() {
            let at = 28 - 4 * i;
            *word = u32::from_be_bytes([
                self.data[at],
                self.data[at + 1],
                self.data[at + 2],
                self.data[at + 3],
            ]);
        }
        w
    }

    fn from_words(w: &[u32; 8], first: bool, last: bool) -> Beat {
        let mut data = [0u8; 32];
        for (i, word) in w.iter().enumerate() {
            let at = 28 - 4 * i;
            data[at..at + 4].copy_from_slice(&word.to_be_bytes());
        }
        Beat { data, first, last }
    }
}

/// What the AXI-Lite slave drives.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AxilOut {
    /// `s_axil_awready`.
    pub awready: bool,
    /// `s_axil_wready`.
    pub wready: bool,
    /// `s_axil_bvalid`.
    pub bvalid: bool,
    /// `s_axil_arready`.
    pub arready: bool,
    /// `s_axil_rvalid`.
    pub rvalid: bool,
    /// `s_axil_rdata`.
    pub rdata: u32,
}

/// What the host drives on the AXI-Lite port.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AxilIn {
    /// `s_axil_awaddr`.
    pub awaddr: u32,
    /// `s_axil_awvalid`.
    pub awvalid: bool,
    /// `s_axil_wdata`.
    pub wdata: u32,
    /// `s_axil_wvalid`.
    pub wvalid: bool,
    /// `s_axil_bready`.
    pub bready: bool,
    /// `s_axil_araddr`.
    pub araddr: u32,
    /// `s_axil_arvalid`.
    pub arvalid: bool,
    /// `s_axil_rready`.
    pub rready: bool,
}

/// A running model. Drive inputs, [`Sim::eval`], sample outputs (the
/// handshakes that will happen at the coming edge), then [`Sim::tick`].
pub struct Sim {
    fns: ModelFns,
    ptr: *mut c_void,
    cycle: u64,
}

impl Sim {
    /// A fresh model, held in reset for a few cycles and released.
    pub fn new(model: Model) -> Sim {
        let fns = model.fns();
        // SAFETY: the shim allocates a model and returns an owned pointer.
        let ptr = unsafe { (fns.new)() };
        assert!(!ptr.is_null(), "the shim could not create the model");
        let mut sim = Sim { fns, ptr, cycle: 0 };
        // SAFETY (here and below): `ptr` is live until drop and only used
        // from this thread (`Sim` is neither Send nor Sync).
        unsafe { (sim.fns.set_rst)(sim.ptr, 1) };
        for _ in 0..4 {
            sim.eval();
            sim.tick();
        }
        unsafe { (sim.fns.set_rst)(sim.ptr, 0) };
        sim.eval();
        sim.cycle = 0;
        sim
    }

    /// Overlay ports.
    pub fn ports(&self) -> usize {
        unsafe { (self.fns.ports)() as usize }
    }

    /// Underlay stacks.
    pub fn stacks(&self) -> usize {
        unsafe { (self.fns.stacks)() as usize }
    }

    /// Streams of a group.
    pub fn streams(&self, kind: Stream) -> usize {
        match kind {
            Stream::Port => self.ports(),
            Stream::Stack => self.stacks(),
            Stream::Interface => 1,
        }
    }

    /// Clock edges since reset was released.
    pub fn cycle(&self) -> u64 {
        self.cycle
    }

    /// Presents `beat` (or nothing) on input `i` of `kind`.
    pub fn set_input(&mut self, kind: Stream, i: usize, beat: Option<&Beat>) {
        let (valid, first, last, words) = match beat {
            Some(b) => (1, b.first as c_int, b.last as c_int, b.to_words()),
            None => (0, 0, 0, [0; 8]),
        };
        unsafe {
            (self.fns.set_in)(
                self.ptr,
                kind.code(),
                i as c_uint,
                valid,
                first,
                last,
                words.as_ptr(),
            )
        };
    }

    /// Whether input `i` of `kind` accepts a beat at the coming edge.
    pub fn input_ready(&self, kind: Stream, i: usize) -> bool {
        unsafe { (self.fns.in_ready)(self.ptr, kind.code(), i as c_uint) != 0 }
    }

    /// Sets `ready` of output `i` of `kind`.
    pub fn set_output_ready(&mut self, kind: Stream, i: usize, ready: bool) {
        unsafe { (self.fns.set_out_ready)(self.ptr, kind.code(), i as c_uint, ready as c_int) };
    }

    /// The beat output `i` of `kind` offers, if valid.
    pub fn output(&self, kind: Stream, i: usize) -> Option<Beat> {
        let mut first: c_int = 0;
        let mut last: c_int = 0;
        let mut w = [0u32; 8];
        let valid = unsafe {
            (self.fns.out)(
                self.ptr,
                kind.code(),
                i as c_uint,
                &mut first,
                &mut last,
                w.as_mut_ptr(),
            )
        };
        (valid != 0).then(|| Beat::from_words(&w, first != 0, last != 0))
    }

    /// Drives the AXI-Lite inputs.
    pub fn set_axil(&mut self, a: AxilIn) {
        unsafe {
            (self.fns.set_axil)(
                self.ptr,
                a.awaddr,
                a.awvalid as c_int,
                a.wdata,
                a.wvalid as c_int,
                a.bready as c_int,
                a.araddr,
                a.arvalid as c_int,
                a.rready as c_int,
            )
        };
    }

    /// Samples the AXI-Lite outputs.
    pub fn axil(&self) -> AxilOut {
        let mut o = [0u32; 6];
        unsafe { (self.fns.axil_out)(self.ptr, o.as_mut_ptr()) };
        AxilOut {
            awready: o[0] != 0,
            wready: o[1] != 0,
            bvalid: o[2] != 0,
            arready: o[3] != 0,
            rvalid: o[4] != 0,
            rdata: o[5],
        }
    }

    /// Settles the logic after inputs changed.
    pub fn eval(&mut self) {
        unsafe { (self.fns.eval)(self.ptr) };
    }

    /// One clock cycle (rising edge, then falling).
    pub fn tick(&mut self) {
        unsafe { (self.fns.tick)(self.ptr) };
        self.cycle += 1;
    }
}

// SAFETY: a `Sim` owns its model and its Verilator context exclusively and
// every call goes through `&mut self` or `&self` on one thread at a time;
// Verilator models built without --threads may be moved between threads
// (tests/registers.rs runs one on a thread other than its creator's). It
// is not `Sync`.
unsafe impl Send for Sim {}

impl Drop for Sim {
    fn drop(&mut self) {
        unsafe { (self.fns.free)(self.ptr) };
    }
}
