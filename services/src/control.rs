//! The control protocol, as the daemon sees it: the protocol itself lives
//! in the client crate ([`uniplane_client::protocol`]), which applications
//! link without the daemon; this module re-exports it and adds the
//! conversions to the overlay's [`ConnKey`].

pub use uniplane_client::protocol::*;
use uniplane_overlay::acl::ConnKey;

/// The overlay's key of a connection the protocol names.
pub fn conn_key(c: ConnSpec) -> ConnKey {
    ConnKey {
        src: c.src,
        src_port: c.src_port,
        dst: c.dst,
        dst_port: c.dst_port,
    }
}

/// The protocol's name of a connection the overlay keys.
pub fn conn_spec(c: ConnKey) -> ConnSpec {
    ConnSpec {
        src: c.src,
        src_port: c.src_port,
        dst: c.dst,
        dst_port: c.dst_port,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conn_spec_and_conn_key_convert_both_ways() {
        let spec = ConnSpec {
            src: "10.0.0.1:2".parse().unwrap(),
            src_port: 49152,
            dst: "10.0.0.7:3".parse().unwrap(),
            dst_port: 80,
        };
        assert_eq!(conn_spec(conn_key(spec)), spec);
    }
}
