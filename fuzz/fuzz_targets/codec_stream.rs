//! The stream codec on arbitrary bytes fed in arbitrary chunks: no panic,
//! no unbounded buffering, and every message it yields re-encodes to the
//! bytes it consumed.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use tokio_util::codec::Decoder;
use uniplane_dataplane::codec::MessageCodec;

fuzz_target!(|data: &[u8]| {
    let Some((&chunk, rest)) = data.split_first() else {
        return;
    };
    let chunk = usize::from(chunk).max(1);
    let mut codec = MessageCodec::new();
    let mut buf = BytesMut::new();
    let mut consumed = Vec::new();
    for piece in rest.chunks(chunk) {
        buf.extend_from_slice(piece);
        loop {
            match codec.decode(&mut buf) {
                Ok(Some(m)) => {
                    let mut out = BytesMut::new();
                    m.encode(&mut out);
                    consumed.extend_from_slice(&out);
                }
                Ok(None) => break,
                Err(_) => return,
            }
        }
        assert!(buf.len() <= 64 + 65535 + chunk, "codec buffered too much");
    }
    assert_eq!(&consumed[..], &rest[..consumed.len()]);
});
