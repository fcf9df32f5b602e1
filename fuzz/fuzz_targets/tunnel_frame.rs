//! A tunnel's receiving end on arbitrary bytes: the frame decoder, then
//! the seal (tag, replay window, source check). No panic; a frame made
//! from the input by the real peer's sealer opens to the same message.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use uniplane_dataplane::{Message, Uid};
use uniplane_services::auth::Key;
use uniplane_services::seal::{End, Sealer};

fuzz_target!(|data: &[u8]| {
    let key = || Key::from_hex(&"17".repeat(32)).expect("a key");
    let a: Uid = "10.0.0.1:0".parse().expect("a UID");
    let b: Uid = "10.0.0.2:0".parse().expect("a UID");
    let mut opener = Sealer::new(key(), End::Opener, a, b);
    let mut acceptor = Sealer::new(key(), End::Acceptor, b, a);
    let bytes = Bytes::copy_from_slice(data);
    if let Ok((frame, _)) = Message::decode(&bytes) {
        let _ = acceptor.open(frame.clone());
        // Sealed by the real peer: opens unchanged when its source is the
        // peer's, refused otherwise.
        if let Ok(sealed) = opener.seal(&frame) {
            match acceptor.open(sealed) {
                Ok(m) => assert_eq!(m, frame),
                Err(_) => assert_ne!(frame.header().src.server(), a.server()),
            }
        }
    }
});
