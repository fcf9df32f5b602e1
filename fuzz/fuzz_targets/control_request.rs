//! The daemon's control request decoder on arbitrary bytes: no panic, and
//! every request it reads is written back to a line that reads the same.
#![no_main]

use libfuzzer_sys::fuzz_target;
use uniplane_client::protocol::decode_request;

fuzz_target!(|data: &[u8]| {
    if let Ok(request) = decode_request(data) {
        let line = serde_json::to_vec(&request).expect("a request is writable");
        let again = decode_request(&line).expect("a written request reads back");
        assert_eq!(again, request, "a request reads back differently");
    }
});
