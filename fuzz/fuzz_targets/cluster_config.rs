//! The configuration parser on arbitrary text: no panic, and whatever it
//! accepts is inside the ranges it documents.
#![no_main]

use libfuzzer_sys::fuzz_target;
use uniplane_services::config::{bounds, Config};

fn within(value: usize, b: bounds::Bounds) -> bool {
    (b.min..=b.max).contains(&(value as u64))
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let config = match Config::parse(text, "fuzz.toml") {
        Ok(c) => c,
        Err(e) => {
            // Every error says where it is.
            assert!(e.to_string().starts_with("fuzz.toml"), "{e}");
            return;
        }
    };
    assert!(within(config.max_ports, bounds::MAX_PORTS));
    assert!(within(config.ring_depth, bounds::RING_DEPTH));
    assert!(within(config.voq_depth, bounds::VOQ_DEPTH));
    assert!(within(config.table_capacity, bounds::TABLE_CAPACITY));
    assert!((config.max_ports * config.max_ports * config.voq_depth) as u64 <= bounds::VOQ_SLOTS);
    for d in &config.devices {
        assert!(within(d.memory, bounds::DEVICE_MEMORY));
        assert_ne!(d.device, Some(0), "device 0 is the daemon's");
    }
    assert!(config.devices.len() < config.max_ports);
    assert!(config.misses >= 1 && !config.heartbeat.is_zero());
});
