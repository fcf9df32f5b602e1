//! The peer protocol on arbitrary bytes, as a listener meets it: an
//! unsealed handshake line, or a sealed line under a session key (a forged
//! tag is almost always refused; a valid one is made from the input too,
//! so the JSON behind the seal is reached). No panic either way.
#![no_main]

use libfuzzer_sys::fuzz_target;
use uniplane_client::protocol::PeerRequest;
use uniplane_services::auth::{Key, LineSeal};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, line)) = data.split_first() else {
        return;
    };
    let key = Key::from_hex(&"42".repeat(32)).expect("a key");
    match mode % 3 {
        // A handshake line.
        0 => {
            let _ = serde_json::from_slice::<PeerRequest>(line);
        }
        // A line as it arrives, checked against the seal.
        1 => {
            let mut listener = LineSeal::new(key, false);
            if let Ok(body) = listener.open(line) {
                let _ = serde_json::from_slice::<PeerRequest>(body);
            }
        }
        // A line the real peer sealed: its body must come out unchanged
        // and decode without a panic.
        _ => {
            let mut dialler = LineSeal::new(key.clone(), true);
            let mut listener = LineSeal::new(key, false);
            let sealed = dialler.seal(line);
            let body = listener.open(&sealed).expect("a sealed line opens");
            assert_eq!(body, line);
            let _ = serde_json::from_slice::<PeerRequest>(body);
        }
    }
});
