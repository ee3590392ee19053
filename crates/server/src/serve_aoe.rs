//! The AoE side of `blockwire serve`: an export's AoE target starts only on an
//! address nobody else answers, and holds its claim on it while it serves.

use anyhow::{anyhow, Context, Result};
use blockwire_aoe::probe::{who_answers_on, LocalClaim, DEFAULT_WAIT};
use blockwire_aoe::target::{AoeTarget, TargetConfig};
use blockwire_blockdev::Device;

use crate::config::{AoeSection, XdpChoice};

/// The AoE target settings of an export's `aoe` table.
pub fn aoe_config(section: &AoeSection) -> TargetConfig {
    let mut config = TargetConfig::new(section.shelf, section.slot, section.interfaces.clone());
    if let Some(count) = section.buffer_count {
        config.buffer_count = count;
    }
    config.config_string = section.config_string.clone().into_bytes();
    config.xdp = section.xdp.map(XdpChoice::hook);
    config
}

/// A running AoE target and its claims on its address, one per interface; both
/// end together.
pub struct ServedAoe {
    target: AoeTarget,
    address: String,
    _claims: Vec<LocalClaim>,
}

impl ServedAoe {
    /// Serves one export over AoE, unless its address is taken on one of its
    /// interfaces: by a blockwire process on this host (its claim), or by any
    /// target that answers a config query there (vblade, another host). The
    /// refusal names the MAC that answered.
    pub fn start(name: &str, device: Device, config: TargetConfig) -> Result<ServedAoe> {
        let address = format!("e{}.{}", config.shelf, config.slot);
        let refuse = |why: String| anyhow!("export '{name}': cannot serve AoE {address}: {why}");
        let claims = config
            .interfaces
            .iter()
            .map(|interface| LocalClaim::take(interface, config.shelf, config.slot))
            .collect::<std::io::Result<Vec<_>>>()
            .map_err(|e| refuse(e.to_string()))?;
        let taken = who_answers_on(&config.interfaces, config.shelf, config.slot, DEFAULT_WAIT)
            .map_err(|e| refuse(e.to_string()))?;
        if let Some(taken) = taken.first() {
            return Err(refuse(format!(
                "{taken} (two targets on one address corrupt every initiator's data; pick \
                 another --shelf/--slot, or stop the other target)"
            )));
        }
        let target = AoeTarget::start(device, config)
            .with_context(|| format!("export '{name}': cannot serve AoE {address}"))?;
        Ok(ServedAoe {
            target,
            address,
            _claims: claims,
        })
    }

    /// Says where the target answers.
    pub fn announce(&self, name: &str) {
        let address = &self.address;
        for interface in self.target.interfaces() {
            println!(
                "export '{name}': aoe {address} on {} (MTU {}); initiators use aoe://IFACE/{address}",
                interface.name, interface.mtu
            );
        }
    }

    /// Stops the target (a final flush), then lets its address go.
    pub fn stop(self) -> blockwire_blockdev::Result<()> {
        self.target.stop()
    }
}
