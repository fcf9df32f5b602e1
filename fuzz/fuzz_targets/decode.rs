//! Every decoder of the header and message, on arbitrary bytes: none may
//! panic, and whatever decodes must re-encode to the same bytes.
#![no_main]

use bytes::{Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use uniplane_dataplane::wire::{Frame, Header, HeaderView};
use uniplane_dataplane::Message;

fuzz_target!(|data: &[u8]| {
    let header = Header::decode(data);
    let view = HeaderView::new_checked(data);
    assert_eq!(header.is_ok(), view.is_ok(), "view and decoder disagree");
    if let Ok(h) = header {
        let mut again = [0u8; 64];
        let len = h.encode(&mut again).expect("64 bytes hold any header");
        assert_eq!(&again[..len], &data[..len], "header re-encodes differently");
        assert!(h.validate().is_ok());
    }
    let _ = Frame::new_checked(data);
    let bytes = Bytes::copy_from_slice(data);
    if let Ok((m, used)) = Message::decode(&bytes) {
        let mut out = BytesMut::new();
        m.encode(&mut out);
        assert_eq!(&out[..], &data[..used], "message re-encodes differently");
    }
});
