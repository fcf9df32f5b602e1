//! Malformed and out-of-policy input never panics the filter, the demux or
//! the multiplexer, and their verdicts agree with the rules.

use bytes::{Bytes, BytesMut};
use proptest::prelude::*;
use uniplane_dataplane::wire::{
    ConfigParams, CopyParams, Header, MemoryParams, MsgFlags, ParamForm, Params, PortParams,
    ReadParams, ReqType, Request,
};
use uniplane_dataplane::{Message, Uid};
use uniplane_underlay::{
    AddressWindow, Demux, DemuxRule, FilterRules, InterfaceMux, MuxConfig, OfferError, Reason,
    TypeSet, UidMatch, Violation,
};

fn any_uid() -> impl Strategy<Value = Uid> {
    any::<u64>().prop_map(|v| Uid::from_u64(v & Uid::MASK).expect("48 bits"))
}

/// UIDs from a small pool half of the time, so rules and messages meet.
fn near_uid() -> impl Strategy<Value = Uid> {
    prop_oneof![
        (0u8..4, 0u16..4).prop_map(|(s, d)| Uid::new([10, 0, 0, s].into(), d)),
        any_uid(),
    ]
}

/// Addresses near the edges of windows and of the 64-bit space.
fn edgy_u64() -> impl Strategy<Value = u64> {
    prop_oneof![
        any::<u64>(),
        0u64..0x3000,
        (0u64..0x3000).prop_map(|d| u64::MAX - d),
    ]
}

/// Raw field values, put into whatever layout the type code asks for;
/// zero lengths, reserved types and flags included.
#[allow(clippy::type_complexity)]
fn raw_header() -> impl Strategy<Value = (u8, u8, Uid, Uid, u32, u8, u16, u64, u64, Uid, usize)> {
    let memory = [ReqType::Write, ReqType::Read, ReqType::Copy].map(ReqType::to_u8);
    let known: Vec<u8> = ReqType::ALL.iter().map(|t| t.to_u8()).collect();
    (
        prop_oneof![
            proptest::sample::select(memory.to_vec()),
            proptest::sample::select(known),
            any::<u8>(),
        ],
        prop_oneof![3 => 0u8..8, 1 => any::<u8>()],
        near_uid(),
        near_uid(),
        any::<u32>(),
        any::<u8>(),
        prop_oneof![any::<u16>(), 0u16..3],
        edgy_u64(),
        edgy_u64(),
        near_uid(),
        0usize..3000,
    )
}

/// A message from raw fields, when the fields make one (the rest are
/// refused by `Message::new`, as the stacks' decoders refuse them).
fn build(
    (code, flags, src, dst, seqnum, flag, length, a, b, target, payload): (
        u8,
        u8,
        Uid,
        Uid,
        u32,
        u8,
        u16,
        u64,
        u64,
        Uid,
        usize,
    ),
) -> Option<Message> {
    let kind = ReqType::from_u8(code)?;
    let params = match kind.form() {
        ParamForm::Port => Params::Port(PortParams {
            flag,
            src_port: a as u16,
            dst_port: b as u16,
        }),
        ParamForm::Memory => Params::Memory(MemoryParams {
            flag,
            length,
            addr: a,
        }),
        ParamForm::Flush => Params::Flush(flag),
        ParamForm::Read => Params::Read(ReadParams {
            flag,
            length,
            src_addr: a,
            dst_addr: b,
        }),
        ParamForm::Copy => Params::Copy(CopyParams {
            flag,
            length,
            target,
            src_addr: a,
            dst_addr: b,
        }),
        ParamForm::Config => Params::Config(ConfigParams {
            flag,
            reg: length,
            value: a,
        }),
        ParamForm::Opaque => {
            let mut raw = [0u8; 12];
            raw[..8].copy_from_slice(&a.to_be_bytes());
            raw[8..].copy_from_slice(&(b as u32).to_be_bytes());
            Params::Opaque(raw)
        }
    };
    let mut header = Header::new(src, dst, Request::new(kind, params).ok()?);
    header.flags = MsgFlags::from_bits(flags)?;
    header.seqnum = seqnum;
    let payload = if kind.carries_payload() { payload } else { 0 };
    Message::new(header, Bytes::from(vec![0u8; payload])).ok()
}

fn uid_match() -> impl Strategy<Value = UidMatch> {
    prop_oneof![
        Just(UidMatch::ANY),
        near_uid().prop_map(UidMatch::exact),
        (near_uid(), 0u32..=48).prop_map(|(u, bits)| UidMatch::prefix(u, bits)),
        (near_uid(), any::<u64>()).prop_map(|(u, m)| UidMatch::new(u, m)),
    ]
}

fn rules() -> impl Strategy<Value = FilterRules> {
    // Each rule is lax half of the time, so that every later rule gets
    // its turn to judge.
    (
        prop_oneof![
            Just(vec![UidMatch::ANY]),
            proptest::collection::vec(uid_match(), 0..4)
        ],
        prop_oneof![Just(usize::MAX), 0usize..200, 0usize..70_000],
        prop_oneof![
            Just(TypeSet::ALL),
            any::<[u64; 4]>().prop_map(TypeSet::from_words)
        ],
        proptest::collection::vec(window(), 0..4),
    )
        .prop_map(|(sources, max_len, types, windows)| FilterRules {
            sources,
            max_len,
            types,
            windows: windows.into_iter().flatten().collect(),
        })
}

/// A window, or `None` for parameters `AddressWindow::new` refuses.
fn window() -> impl Strategy<Value = Option<AddressWindow>> {
    prop_oneof![
        1 => Just(Some(AddressWindow::everything(UidMatch::ANY))),
        4 => (
            prop_oneof![Just(UidMatch::ANY), uid_match()],
            edgy_u64(),
            prop_oneof![0u64..0x4000, any::<u64>()],
        )
            .prop_map(|(m, base, len)| AddressWindow::new(m, base, len).ok()),
    ]
}

fn demux_rules() -> impl Strategy<Value = (Vec<DemuxRule>, Option<usize>)> {
    (
        proptest::collection::vec(
            (
                uid_match(),
                any::<[u64; 4]>().prop_map(TypeSet::from_words),
                0usize..4,
            ),
            0..6,
        ),
        proptest::option::of(0usize..4),
    )
        .prop_map(|(rules, default)| {
            let rules = rules
                .into_iter()
                .map(|(dst, types, output)| DemuxRule::new(dst, types, output))
                .collect();
            (rules, default)
        })
}

/// The filter's verdict restated rule by rule, to compare against.
fn expected(rules: &FilterRules, m: &Message) -> Result<(), Reason> {
    let h = m.header();
    if !rules.sources.iter().any(|s| s.matches(h.src)) {
        return Err(Reason::SourceDenied);
    }
    if !rules.types.contains_code(m.kind().to_u8()) {
        return Err(Reason::TypeDenied);
    }
    if h.len() + m.payload().len() > rules.max_len {
        return Err(Reason::TooLong);
    }
    let inside = |uid: Uid, addr: u64, len: u16| {
        let end = u128::from(addr) + u128::from(len.max(1));
        rules
            .windows
            .iter()
            .any(|w| w.uid().matches(uid) && addr >= w.base() && end <= u128::from(w.last()) + 1)
    };
    let ok = match (m.kind(), h.request.params()) {
        (ReqType::Write, Params::Memory(p)) => inside(h.dst, p.addr, p.length),
        (ReqType::Read, Params::Read(p)) => inside(h.dst, p.src_addr, p.length),
        (ReqType::Copy, Params::Copy(p)) => {
            inside(h.dst, p.src_addr, p.length) && inside(p.target, p.dst_addr, p.length)
        }
        _ => true,
    };
    if ok {
        Ok(())
    } else {
        Err(Reason::OutOfWindow)
    }
}

/// Runs `m` through a filter, a demux and a mux built from the rules, and
/// checks that they agree with each other and with the rules.
fn exercise(
    m: &Message,
    rules: &FilterRules,
    demux: &(Vec<DemuxRule>, Option<usize>),
) -> Result<(), TestCaseError> {
    let verdict = rules.check(m);
    prop_assert_eq!(verdict.map_err(|v| v.reason()), expected(rules, m));

    let mut mux = InterfaceMux::new(MuxConfig {
        rules: rules.clone(),
        event_capacity: 1,
        ..MuxConfig::new(2, 1)
    })
    .expect("a valid configuration");
    match mux.offer(1, m.clone(), 5) {
        Ok(()) => {
            prop_assert!(verdict.is_ok());
            prop_assert_eq!(mux.next_ready(5), Some(5));
            prop_assert_eq!(mux.dequeue(5), Some(m.clone()));
        }
        Err(OfferError::Denied(v)) => {
            prop_assert_eq!(Err::<(), Violation>(v), verdict);
            prop_assert_eq!(mux.filter_counters().dropped(v.reason()), 1);
            prop_assert_eq!(mux.pop_event().map(|e| e.violation), Some(v));
        }
        Err(e) => prop_assert!(false, "unexpected {}", e),
    }

    let (rules, default) = demux.clone();
    let mut d = Demux::new(4, rules, default).expect("outputs exist");
    let out = d.classify(m.header());
    let first = d.rules().iter().find(|r| r.matches(m.header()));
    prop_assert_eq!(out, first.map(|r| r.output).or(default));
    prop_assert_eq!(d.counters().misses, u64::from(first.is_none()));
    prop_assert_eq!(d.counters().dropped, u64::from(out.is_none()));
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    #[test]
    fn arbitrary_headers_get_a_verdict_and_an_output_without_panicking(
        raw in raw_header(), rules in rules(), demux in demux_rules(),
    ) {
        if let Some(m) = build(raw) {
            exercise(&m, &rules, &demux)?;
        }
    }

    #[test]
    fn corrupted_frames_that_still_decode_are_judged_like_any_other(
        raw in raw_header(),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        rules in rules(),
        demux in demux_rules(),
    ) {
        let Some(m) = build(raw) else { return Ok(()) };
        let mut buf = BytesMut::new();
        m.encode(&mut buf);
        let header_len = m.header().len();
        for (at, byte) in flips {
            // Corrupt the header, where the filter and demux look.
            buf[at.index(header_len)] ^= byte;
        }
        if let Ok((m, _)) = Message::decode(&buf.freeze()) {
            exercise(&m, &rules, &demux)?;
        }
    }
}
