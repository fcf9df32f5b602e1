//! `uniplane-relay LISTEN TARGET [SEED LOSS DUP REORDER DELAY_CHANCE DELAY_US IDLE_S]`:
//! forwards UDP between one client and TARGET, impaired and seeded; stops
//! after IDLE_S seconds (default 10) without traffic.

use std::time::Duration;

use uniplane_netns::relay::{Impairment, Relay};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 2 {
        eprintln!("usage: uniplane-relay LISTEN TARGET [SEED LOSS DUP REORDER DELAY_CHANCE DELAY_US IDLE_S]");
        std::process::exit(2);
    }
    let num = |i: usize, d: f64| -> Result<f64, Box<dyn std::error::Error>> {
        Ok(match args.get(i) {
            Some(s) => s.parse()?,
            None => d,
        })
    };
    let imp = Impairment {
        seed: num(2, 1.0)? as u64,
        loss: num(3, 0.0)?,
        duplicate: num(4, 0.0)?,
        reorder: num(5, 0.0)?,
        delay_chance: num(6, 0.0)?,
        delay: Duration::from_micros(num(7, 0.0)? as u64),
    };
    let idle = Duration::from_secs_f64(num(8, 10.0)?);
    let relay = Relay::start(args[0].parse()?, args[1].parse()?, imp, idle)?;
    eprintln!("relaying {} -> {}", relay.local_addr(), args[1]);
    relay.wait()?;
    Ok(())
}
