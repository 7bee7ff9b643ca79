//! [`RdmaDevices`]: the devices one transport uses, opened from a `device_name` list.

use super::device::{setup_error, RdmaDevice};
use crate::error::Result;
use std::sync::Arc;

/// The open devices of one transport, in the order `device_name` named them (at least one).
/// Every registered range is registered on each, queue pairs are made per (device, peer),
/// and slices are striped across them. Cheap to clone (shares the devices); thread-safe.
#[derive(Clone, Debug)]
pub struct RdmaDevices {
    devices: Vec<Arc<RdmaDevice>>,
}

impl RdmaDevices {
    /// Opens every device of `device_names`, comma-separated like Mooncake's `device_name`
    /// (`"mlx5_0,mlx5_1"`; spaces around names are ignored); empty: the first device the
    /// library lists.
    ///
    /// Errors: `TRANSFER_FAIL` naming the device: one that cannot be opened (see
    /// [`RdmaDevice::open`]), or one named twice (two QPs on one device are not striping).
    pub fn open(device_names: &str) -> Result<RdmaDevices> {
        let names: Vec<&str> = device_names
            .split(',')
            .map(str::trim)
            .filter(|name| !name.is_empty())
            .collect();
        if let Some(twice) = names
            .iter()
            .enumerate()
            .find_map(|(i, name)| names[..i].contains(name).then_some(name))
        {
            return setup_error(format_args!(
                "device {twice:?} is named twice in {device_names:?}"
            ));
        }
        let devices = match names.is_empty() {
            true => vec![RdmaDevice::open("")?],
            false => names
                .iter()
                .map(|name| RdmaDevice::open(name))
                .collect::<Result<Vec<_>>>()?,
        };
        Ok(RdmaDevices { devices })
    }

    /// The devices, in the order they were named (never empty).
    pub fn devices(&self) -> &[Arc<RdmaDevice>] {
        &self.devices
    }
}

impl From<Arc<RdmaDevice>> for RdmaDevices {
    /// The one device `device`.
    fn from(device: Arc<RdmaDevice>) -> RdmaDevices {
        RdmaDevices {
            devices: vec![device],
        }
    }
}
