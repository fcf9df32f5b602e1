//! The wire format as a specification: every request type, every field
//! range, and every way bytes can be wrong.

use bytes::{Bytes, BytesMut};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use tokio_util::codec::{Decoder, Encoder};
use uniplane_dataplane::codec::MessageCodec;
use uniplane_dataplane::wire::{
    field, ConfigParams, CopyParams, DecodeError, Frame, Header, HeaderView, MemoryParams,
    MsgFlags, ParamForm, Params, PortParams, ReadParams, ReqType, Request, HEADER_LEN,
};
use uniplane_dataplane::{LinkError, Message, Uid};

fn uid(s: &str) -> Uid {
    s.parse().unwrap()
}

fn arb_uid() -> impl Strategy<Value = Uid> {
    (0u64..=Uid::MASK).prop_map(|v| Uid::from_u64(v).unwrap())
}

fn arb_type() -> impl Strategy<Value = ReqType> {
    prop_oneof![
        proptest::sample::select(ReqType::ALL.to_vec()),
        (0x80u8..=0xff).prop_map(ReqType::User),
    ]
}

fn arb_params(kind: ReqType) -> BoxedStrategy<Params> {
    match kind.form() {
        ParamForm::Port => (any::<u8>(), any::<u16>(), any::<u16>())
            .prop_map(|(flag, src_port, dst_port)| {
                Params::Port(PortParams {
                    flag,
                    src_port,
                    dst_port,
                })
            })
            .boxed(),
        ParamForm::Memory => (any::<u8>(), any::<u16>(), any::<u64>())
            .prop_map(|(flag, length, addr)| Params::Memory(MemoryParams { flag, length, addr }))
            .boxed(),
        ParamForm::Flush => any::<u8>().prop_map(Params::Flush).boxed(),
        ParamForm::Read => (any::<u8>(), 1u16.., any::<u64>(), any::<u64>())
            .prop_map(|(flag, length, src_addr, dst_addr)| {
                Params::Read(ReadParams {
                    flag,
                    length,
                    src_addr,
                    dst_addr,
                })
            })
            .boxed(),
        ParamForm::Copy => (any::<u8>(), 1u16.., arb_uid(), any::<u64>(), any::<u64>())
            .prop_map(|(flag, length, target, src_addr, dst_addr)| {
                Params::Copy(CopyParams {
                    flag,
                    length,
                    target,
                    src_addr,
                    dst_addr,
                })
            })
            .boxed(),
        ParamForm::Config => (any::<u8>(), any::<u16>(), any::<u64>())
            .prop_map(|(flag, reg, value)| Params::Config(ConfigParams { flag, reg, value }))
            .boxed(),
        ParamForm::Opaque => any::<[u8; 12]>().prop_map(Params::Opaque).boxed(),
    }
}

/// Any valid message: every type, every field over its whole range, a
/// payload where the type allows one.
fn arb_message() -> impl Strategy<Value = Message> {
    arb_type()
        .prop_flat_map(|kind| {
            let payload = if kind.carries_payload() {
                proptest::collection::vec(any::<u8>(), 0..300).boxed()
            } else {
                Just(Vec::new()).boxed()
            };
            let flags = if kind.is_answer() {
                (0u8..16).boxed()
            } else {
                (0u8..8).boxed()
            };
            (
                Just(kind),
                arb_params(kind),
                arb_uid(),
                arb_uid(),
                flags,
                any::<u32>(),
                payload,
            )
        })
        .prop_map(|(kind, params, src, dst, flags, seqnum, payload)| {
            let mut header = Header::new(src, dst, Request::new(kind, params).unwrap());
            header.flags = MsgFlags::from_bits(flags).unwrap();
            header.seqnum = seqnum;
            Message::new(header, Bytes::from(payload)).unwrap()
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn every_valid_message_round_trips(m in arb_message()) {
        let mut buf = BytesMut::new();
        m.encode(&mut buf);
        prop_assert_eq!(buf.len(), m.encoded_len());
        prop_assert_eq!(buf.len(), m.header().len() + m.payload().len());
        let bytes = buf.freeze();
        let (back, used) = Message::decode(&bytes).unwrap();
        prop_assert_eq!(used, bytes.len());
        prop_assert_eq!(&back, &m);

        let view = HeaderView::new_checked(&bytes[..]).unwrap();
        prop_assert_eq!(view.src_uid(), m.header().src);
        prop_assert_eq!(view.dst_uid(), m.header().dst);
        prop_assert_eq!(view.seqnum(), m.header().seqnum);
        prop_assert_eq!(view.msg_length() as usize, m.payload().len());
    }

    #[test]
    fn decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let b = Bytes::from(bytes);
        if let Ok((m, used)) = Message::decode(&b) {
            // Whatever decodes re-encodes to the same bytes.
            let mut again = BytesMut::new();
            m.encode(&mut again);
            prop_assert_eq!(&again[..], &b[..used]);
        }
        let _ = Header::decode(&b);
        let mut codec = MessageCodec::new();
        let _ = codec.decode(&mut BytesMut::from(&b[..]));
    }

    #[test]
    fn a_flipped_bit_is_rejected_or_decoded_exactly(
        m in arb_message(), bit in 0usize..256,
    ) {
        let mut buf = BytesMut::new();
        m.encode(&mut buf);
        buf[bit / 8] ^= 1 << (bit % 8);
        let b = buf.freeze();
        // Whatever still decodes is a valid message that re-encodes to the
        // very same bytes: the decoder neither normalises nor loses a bit.
        if let Ok((m2, used)) = Message::decode(&b) {
            prop_assert!(m2.header().validate().is_ok());
            let mut again = BytesMut::new();
            m2.encode(&mut again);
            prop_assert_eq!(&again[..], &b[..used]);
        }
    }

    #[test]
    fn the_codec_splits_a_stream_at_any_point(
        msgs in proptest::collection::vec(arb_message(), 1..8), cut in any::<prop::sample::Index>(),
    ) {
        let mut codec = MessageCodec::new();
        let mut stream = BytesMut::new();
        for m in &msgs {
            codec.encode(m, &mut stream).unwrap();
        }
        let cut = cut.index(stream.len() + 1);
        let mut input = BytesMut::from(&stream[..cut]);
        let mut out = Vec::new();
        while let Some(m) = codec.decode(&mut input).unwrap() {
            out.push(m);
        }
        input.extend_from_slice(&stream[cut..]);
        while let Some(m) = codec.decode(&mut input).unwrap() {
            out.push(m);
        }
        prop_assert!(input.is_empty());
        prop_assert_eq!(out, msgs);
    }
}

fn encode(m: &Message) -> BytesMut {
    let mut buf = BytesMut::new();
    m.encode(&mut buf);
    buf
}

fn send() -> Message {
    Message::send(
        uid("10.0.0.7:3").port(80),
        uid("10.0.0.9:1").port(443),
        Bytes::from_static(b"hello"),
    )
    .unwrap()
}

#[test]
fn a_send_encodes_to_the_documented_bytes() {
    let mut m = send();
    m.set_seqnum(42);
    let expected: [u8; 37] = [
        0x0a, 0x00, 0x00, 0x07, 0x00, 0x03, // src_uid 10.0.0.7:3
        0x0a, 0x00, 0x00, 0x09, 0x00, 0x01, // dst_uid 10.0.0.9:1
        0x00, 0x05, // msg_length 5
        0x03, // msg_flag FIRST|LAST
        0x00, 0x00, 0x00, 0x2a, // msg_seqnum 42
        0x01, // req_type SEND
        0x00, 0x00, 0x50, 0x01, 0xbb, // req_flag, src_port 80, dst_port 443
        0, 0, 0, 0, 0, 0, 0, // reserved
        b'h', b'e', b'l', b'l', b'o',
    ];
    assert_eq!(&encode(&m)[..], &expected[..]);
}

#[test]
fn a_write_encodes_to_the_documented_bytes() {
    let mut m = Message::write(
        uid("10.0.0.7:3"),
        uid("10.0.0.7:5").at(0x1000),
        Bytes::from_static(&[0xde, 0xad, 0xbe, 0xef]),
    )
    .unwrap();
    m.set_seqnum(7);
    let expected: [u8; 36] = [
        0x0a, 0x00, 0x00, 0x07, 0x00, 0x03, // src_uid
        0x0a, 0x00, 0x00, 0x07, 0x00, 0x05, // dst_uid
        0x00, 0x04, 0x03, // msg_length 4, FIRST|LAST
        0x00, 0x00, 0x00, 0x07, // seqnum 7
        0x05, // WRTE
        0x00, 0x00, 0x04, // req_flag, req_length 4
        0, 0, 0, 0, 0, 0, 0x10, 0x00, // dst_addr 0x1000
        0x00, // reserved
        0xde, 0xad, 0xbe, 0xef,
    ];
    assert_eq!(&encode(&m)[..], &expected[..]);
}

#[test]
fn a_read_has_a_second_beat_with_both_addresses() {
    let m = Message::read(
        uid("10.0.0.7:3").at(0x2000),
        uid("10.0.0.7:5").at(0x1000),
        256,
    )
    .unwrap();
    let b = encode(&m);
    assert_eq!(b.len(), 64);
    assert_eq!(b[field::REQ_TYPE], 0x07);
    assert_eq!(&b[field::REQ_LENGTH], &[0x01, 0x00]);
    assert_eq!(&b[field::EXT_SRC_ADDR], &0x1000u64.to_be_bytes());
    assert_eq!(&b[field::EXT_DST_ADDR], &0x2000u64.to_be_bytes());
    assert!(b[field::EXT_RESERVED].iter().all(|&x| x == 0));
}

#[test]
fn short_buffers_are_truncated_errors() {
    let b = encode(&send());
    for len in 0..b.len() {
        let r = Message::decode(&Bytes::copy_from_slice(&b[..len]));
        assert!(
            matches!(r, Err(DecodeError::Truncated { .. })),
            "{len}: {r:?}"
        );
    }
    let read = encode(&Message::read(uid("1.1.1.1:1").at(0), uid("1.1.1.1:2").at(0), 1).unwrap());
    assert_eq!(
        Header::decode(&read[..HEADER_LEN]),
        Err(DecodeError::Truncated {
            needed: 64,
            available: 32
        })
    );
}

#[test]
fn unknown_types_are_refused() {
    for code in [0x00u8, 0x14, 0x3f, 0x44, 0x7f] {
        let mut b = encode(&send());
        b[field::REQ_TYPE] = code;
        assert_eq!(
            Header::decode(&b),
            Err(DecodeError::UnknownRequestType(code))
        );
    }
}

#[test]
fn reserved_bits_are_refused() {
    let mut b = encode(&send());
    b[field::MSG_FLAG] |= 0x10;
    assert_eq!(Header::decode(&b), Err(DecodeError::ReservedFlagBits(0x13)));

    let mut b = encode(&send());
    b[field::PORT_RESERVED.end - 1] = 1;
    assert_eq!(
        Header::decode(&b),
        Err(DecodeError::ReservedParamBits {
            req_type: ReqType::Send
        })
    );

    let mut b = encode(&Message::read(uid("1.1.1.1:1").at(0), uid("1.1.1.1:2").at(0), 1).unwrap());
    b[field::EXT_RESERVED.start] = 0x80;
    assert_eq!(
        Header::decode(&b),
        Err(DecodeError::ReservedParamBits {
            req_type: ReqType::Read
        })
    );
}

#[test]
fn parameters_must_agree_with_the_message() {
    // WRTE whose req_length differs from msg_length.
    let mut b = encode(
        &Message::write(
            uid("1.1.1.1:1"),
            uid("1.1.1.1:2").at(0),
            Bytes::from_static(b"abcd"),
        )
        .unwrap(),
    );
    b[field::REQ_LENGTH.end - 1] = 9;
    assert_eq!(
        Header::decode(&b),
        Err(DecodeError::LengthMismatch {
            req_type: ReqType::Write,
            param_length: 9,
            msg_length: 4
        })
    );
    // A READ of zero bytes.
    let mut b = encode(&Message::read(uid("1.1.1.1:1").at(0), uid("1.1.1.1:2").at(0), 1).unwrap());
    b[field::REQ_LENGTH.end - 1] = 0;
    assert_eq!(
        Header::decode(&b),
        Err(DecodeError::ZeroLength {
            req_type: ReqType::Read
        })
    );
    // SEND_CMPL with a payload length.
    let cmpl = Header::new(
        uid("1.1.1.1:1"),
        uid("1.1.1.1:2"),
        Request::port(ReqType::SendCmpl, 1, 2),
    );
    let mut b = [0u8; 32];
    cmpl.encode(&mut b).unwrap();
    b[field::MSG_LENGTH.end - 1] = 1;
    assert_eq!(
        Header::decode(&b),
        Err(DecodeError::PayloadNotAllowed {
            req_type: ReqType::SendCmpl,
            length: 1
        })
    );
    // The ERROR flag on a request.
    let mut b = encode(&send());
    b[field::MSG_FLAG] |= MsgFlags::ERROR.bits();
    assert_eq!(
        Header::decode(&b),
        Err(DecodeError::ErrorFlagOnRequest {
            req_type: ReqType::Send
        })
    );
}

#[test]
fn a_frame_shorter_than_its_msg_length_is_truncated() {
    let b = encode(&send());
    let r = Frame::new_checked(&b[..b.len() - 1]);
    assert_eq!(
        r.err(),
        Some(DecodeError::Truncated {
            needed: 37,
            available: 36
        })
    );
}

#[test]
fn two_messages_in_one_buffer_decode_one_after_the_other() {
    let mut b = encode(&send());
    b.extend_from_slice(&encode(&send()));
    let bytes = b.freeze();
    let (first, used) = Message::decode(&bytes).unwrap();
    let (second, used2) = Message::decode(&bytes.slice(used..)).unwrap();
    assert_eq!(first, second);
    assert_eq!(used + used2, bytes.len());
}

#[test]
fn requests_refuse_parameters_of_another_layout() {
    assert_eq!(
        Request::new(ReqType::Write, Params::Flush(0)),
        Err(DecodeError::ParamForm {
            req_type: ReqType::Write
        })
    );
}

#[test]
fn payloads_over_65535_bytes_are_refused() {
    let big = Bytes::from(vec![0u8; 65536]);
    assert_eq!(
        Message::send(uid("1.1.1.1:1").port(1), uid("1.1.1.1:2").port(2), big).err(),
        Some(DecodeError::PayloadTooLong(65536))
    );
}

#[test]
fn the_codec_reports_garbage_as_malformed() {
    let mut codec = MessageCodec::new();
    let mut b = BytesMut::from(&[0xffu8; 40][..]);
    // 0xff is a user type, so garbage of the right length can decode; a
    // zero type code cannot.
    b[field::REQ_TYPE] = 0;
    assert!(matches!(
        codec.decode(&mut b),
        Err(LinkError::Malformed(DecodeError::UnknownRequestType(0)))
    ));
}

#[test]
fn the_codec_waits_for_the_whole_message() {
    let mut codec = MessageCodec::new();
    let whole = encode(&send());
    let mut partial = BytesMut::from(&whole[..20]);
    assert!(codec.decode(&mut partial).unwrap().is_none());
    partial.extend_from_slice(&whole[20..36]);
    assert!(codec.decode(&mut partial).unwrap().is_none());
    partial.extend_from_slice(&whole[36..]);
    assert_eq!(codec.decode(&mut partial).unwrap().unwrap(), send());
}

#[test]
fn status_of_an_error_answer_comes_from_req_flag() {
    let req = Request::port(ReqType::SendCmpl, 1, 2).with_flag(1);
    let mut h = Header::new(uid("1.1.1.1:1"), uid("1.1.1.1:2"), req);
    assert_eq!(h.status(), uniplane_dataplane::wire::Status::Ok);
    h.flags = h.flags | MsgFlags::ERROR;
    assert_eq!(h.status(), uniplane_dataplane::wire::Status::NoRoute);
}

/// The hex dump in the fenced block ```hexdump NAME of docs/wire-format.md.
fn doc_dump(name: &str) -> Vec<u8> {
    let doc = include_str!("../../docs/wire-format.md");
    let fence = format!("```hexdump {name}\n");
    let start = doc.find(&fence).expect("dump present") + fence.len();
    let end = start + doc[start..].find("```").expect("dump closed");
    doc[start..end]
        .lines()
        .flat_map(|line| line.split_whitespace().skip(1))
        .map(|b| u8::from_str_radix(b, 16).expect("hex byte"))
        .collect()
}

#[test]
fn docs_hex_dumps_match_the_encoder() {
    let mut s = send();
    s.set_seqnum(42);
    assert_eq!(doc_dump("send"), encode(&s).to_vec());
    let mut w = Message::write(
        uid("10.0.0.7:3"),
        uid("10.0.0.7:5").at(0x1000),
        Bytes::from_static(&[0xde, 0xad, 0xbe, 0xef]),
    )
    .unwrap();
    w.set_seqnum(7);
    assert_eq!(doc_dump("write"), encode(&w).to_vec());
}

#[test]
fn every_request_has_a_valid_error_answer_and_answers_have_none() {
    use uniplane_dataplane::wire::Status;
    let mut runner = proptest::test_runner::TestRunner::default();
    for _ in 0..2000 {
        let m = arb_message().new_tree(&mut runner).unwrap().current();
        match m.error_answer(Status::NoRoute) {
            Some(a) => {
                assert_eq!(Some(a.kind()), m.kind().answer());
                assert_eq!(a.header().status(), Status::NoRoute);
                assert_eq!(
                    (a.header().src, a.header().dst),
                    (m.header().dst, m.header().src)
                );
                assert_eq!(a.header().seqnum, m.header().seqnum);
                assert!(a.header().validate().is_ok());
            }
            None => assert_eq!(m.kind().answer(), None, "{}", m.kind()),
        }
    }
}
