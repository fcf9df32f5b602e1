//! The register map of `uniplane_top`, as software sees it.
//!
//! The space is a chain of 4 KiB pages, each a self-describing block in
//! Corundum's manner: offset 0x000 holds the block type, 0x004 its version,
//! 0x008 the byte address of the next block (0 ends the chain). Software
//! finds blocks by walking the chain ([`discover`]), never by assuming
//! where they sit. Offsets below are relative to a block's base.

/// Bytes per block page.
pub const PAGE: u32 = 0x1000;

/// Block type codes.
pub mod kind {
    /// The ID block: sizes and the header layout digest.
    pub const ID: u32 = 0x5550_0001;
    /// One per overlay port: connector, table, ACL, scheduler, counters.
    pub const PORT: u32 = 0x5550_0010;
    /// The stack translator entries.
    pub const TRANSLATOR: u32 = 0x5550_0020;
    /// The underlay of one interface.
    pub const UNDERLAY: u32 = 0x5550_0030;
}

/// Offsets every block has.
pub mod header {
    /// Block type.
    pub const TYPE: u32 = 0x000;
    /// Block version (major in bits 31:16).
    pub const VERSION: u32 = 0x004;
    /// Address of the next block, 0 at the end.
    pub const NEXT: u32 = 0x008;
}

/// The ID block.
pub mod id {
    /// Overlay ports N.
    pub const PORTS: u32 = 0x00c;
    /// Forwarding entries per port.
    pub const TABLE_ENTRIES: u32 = 0x010;
    /// ACL connection entries per port.
    pub const ACL_CONNECTIONS: u32 = 0x014;
    /// ACL rules per port.
    pub const ACL_RULES: u32 = 0x018;
    /// Translator entries.
    pub const TRANSLATIONS: u32 = 0x01c;
    /// DRR quantum (bytes per round for weight 1).
    pub const QUANTUM: u32 = 0x020;
    /// Underlay stacks.
    pub const STACKS: u32 = 0x024;
    /// Bits per beat.
    pub const BEAT_BITS: u32 = 0x028;
    /// FNV-1a digest of the header field table (`uniplane_hw_gen::layout_hash`).
    pub const LAYOUT_HASH: u32 = 0x02c;
    /// Beats each virtual output queue may always hold (its reserve in its
    /// input's buffer).
    pub const VOQ_DEPTH: u32 = 0x030;
    /// Beats of each input's buffer shared by its virtual output queues
    /// beyond their reserves.
    pub const VOQ_POOL: u32 = 0x040;
    /// The crossbar: bits 7:0 its matching (0: a read port per output, no
    /// matching; 1: a few read ports per input, iSLIP-style matching), bits
    /// 15:8 the matching iterations per cycle and bits 23:16 the read ports
    /// per input (both 0 without matching).
    pub const CROSSBAR: u32 = 0x044;
}

/// A port block.
pub mod port {
    /// Index of the port.
    pub const INDEX: u32 = 0x00c;
    /// Default route: bit 31 valid, bits 7:0 output port.
    pub const DEFAULT_ROUTE: u32 = 0x010;
    /// Bit 0: output paused (its scheduler starts no message).
    pub const PAUSE: u32 = 0x014;
    /// Output policy (shadow): 0 round-robin, 1 deficit round-robin.
    pub const POLICY: u32 = 0x018;
    /// Write: the shadow policy, weights and classes take effect, and the
    /// scheduler forgets its pointers and credit.
    pub const COMMIT: u32 = 0x01c;
    /// 64-bit counters, 8 bytes apart (low word first; reading it latches
    /// the high word): rx_msgs, rx_bytes, tx_msgs, tx_bytes, acl_denied,
    /// no_route, error_answers, unanswerable, input_stalls.
    pub const COUNTERS: u32 = 0x020;
    /// ACL connection entries valid (bit c).
    pub const CONN_VALID: u32 = 0x070;
    /// ACL rules in force (rules 0..count-1).
    pub const RULE_COUNT: u32 = 0x074;
    /// ACL rules that allow (bit r); the others deny.
    pub const RULE_ALLOW: u32 = 0x078;
    /// Capacities: bits 7:0 forwarding entries, 15:8 connections, 23:16 rules.
    pub const CAPACITY: u32 = 0x07c;
    /// Weight of input q at `WEIGHT + 4q` (shadow).
    pub const WEIGHT: u32 = 0x080;
    /// Class of input q at `CLASS + 4q` (shadow).
    pub const CLASS: u32 = 0x0c0;
    /// Connection c at `CONN + 16c`: src lo, {src_port, src hi}, dst lo, {dst_port, dst hi}.
    pub const CONN: u32 = 0x100;
    /// Rule r at `RULE + 32r`: src, src mask, dst, dst mask (lo, hi each).
    pub const RULE: u32 = 0x300;
    /// Forwarding entry e at `ROUTE + 16e`: key lo, {valid[31], port[23:16],
    /// key hi}, mask lo, mask hi. Entry 0 has the highest priority.
    pub const ROUTE: u32 = 0x800;
    /// Word for request type t at `TYPES + 4t`: the rules (bit r) whose
    /// type set holds t.
    pub const TYPES: u32 = 0xc00;
}

/// The translator block.
pub mod translator {
    /// Entries (read only).
    pub const ENTRIES: u32 = 0x00c;
    /// Entries valid (bit t).
    pub const VALID: u32 = 0x010;
    /// Entry t at `ENTRY + 32t`: src lo, {src_port, src hi}, dst lo,
    /// {dst_port, dst hi}, output port.
    pub const ENTRY: u32 = 0x100;
}

/// The underlay block.
pub mod underlay {
    /// Stacks (read only).
    pub const STACKS: u32 = 0x00c;
    /// Largest message, header and payload, in bytes.
    pub const MAX_LEN: u32 = 0x010;
    /// Source patterns valid (bit s).
    pub const SOURCE_VALID: u32 = 0x014;
    /// Bit 0: interface output paused.
    pub const PAUSE: u32 = 0x018;
    /// Interface policy (shadow): 0 round-robin, 1 deficit round-robin.
    pub const POLICY: u32 = 0x01c;
    /// Write: the shadow policy takes effect.
    pub const COMMIT: u32 = 0x020;
    /// Demux rules in force.
    pub const RULE_COUNT: u32 = 0x024;
    /// Demux default: bit 31 valid, bits 7:0 output.
    pub const DEFAULT: u32 = 0x028;
    /// 64-bit counters: passed, source denied, type denied, too long,
    /// classified, misses, dropped, sent on the interface.
    pub const COUNTERS: u32 = 0x040;
    /// Weight of stack q at `WEIGHT + 4q`.
    pub const WEIGHT: u32 = 0x080;
    /// Class of stack q at `CLASS + 4q`.
    pub const CLASS: u32 = 0x0c0;
    /// Source pattern s at `SOURCE + 16s`: key lo, key hi, mask lo, mask hi.
    pub const SOURCE: u32 = 0x100;
    /// Demux rule d at `RULE + 16d`: key lo, {output[23:16], key hi}, mask lo, mask hi.
    pub const RULE: u32 = 0x200;
    /// Allowed request types: bit t%32 of the word at `TYPES + 4(t/32)`.
    pub const TYPES: u32 = 0x400;
    /// Demux rules (bit d) whose type set holds type t, at `RULE_TYPES + 4t`.
    pub const RULE_TYPES: u32 = 0x800;
}

/// One block found in the chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Block {
    /// Its type code ([`kind`]).
    pub kind: u32,
    /// Its version.
    pub version: u32,
    /// Its base address.
    pub base: u32,
}

/// Walks the block chain from address 0 with `read`; stops at a next
/// pointer of 0, one that does not move forward, or after 256 blocks.
pub fn discover(mut read: impl FnMut(u32) -> u32) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut base = 0u32;
    for _ in 0..256 {
        blocks.push(Block {
            kind: read(base + header::TYPE),
            version: read(base + header::VERSION),
            base,
        });
        let next = read(base + header::NEXT);
        if next == 0 || next <= base {
            break;
        }
        base = next;
    }
    blocks
}
