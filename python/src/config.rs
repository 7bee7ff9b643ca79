//! `ReplicateConfig` (spec §2): every attribute upstream has, with its exact validation, and
//! the conversion to the client's [`mooncake_rs::types::ReplicateConfig`].

use crate::convert::U64;
use crate::enums::{ObjectDataType, SoftPinAction};
use mooncake_rs::error::{fail, ErrorCode, Result};
use mooncake_rs::types;
use pyo3::prelude::*;

/// How to place an object's replicas. Plain data: no `__dict__`, no `__eq__`; list
/// attributes return a new list on every read (assign a whole list to change one).
/// Not shared between threads while being mutated (Python's own rules apply).
#[pyclass(module = "mooncake.store", name = "ReplicateConfig", from_py_object)]
#[derive(Clone, Debug)]
pub struct PyReplicateConfig {
    replica_num: u64,
    nof_replica_num: u64,
    dfs_replica_num: u64,
    soft_pin_action: SoftPinAction,
    soft_pin_ttl_ms: Option<u64>,
    with_hard_pin: bool,
    preferred_segments: Vec<String>,
    preferred_nof_segments: Vec<String>,
    preferred_segment: String,
    prefer_alloc_in_same_node: bool,
    data_type: ObjectDataType,
    group_ids: Option<Vec<String>>,
}

impl Default for PyReplicateConfig {
    fn default() -> Self {
        PyReplicateConfig {
            replica_num: 1,
            nof_replica_num: 0,
            dfs_replica_num: 0,
            soft_pin_action: SoftPinAction::PRESERVE,
            soft_pin_ttl_ms: None,
            with_hard_pin: false,
            preferred_segments: Vec::new(),
            preferred_nof_segments: Vec::new(),
            preferred_segment: String::new(),
            prefer_alloc_in_same_node: false,
            data_type: ObjectDataType::UNKNOWN,
            group_ids: None,
        }
    }
}

#[pymethods]
impl PyReplicateConfig {
    #[new]
    fn new() -> Self {
        PyReplicateConfig::default()
    }

    #[getter]
    fn get_replica_num(&self) -> u64 {
        self.replica_num
    }
    #[setter]
    fn set_replica_num(&mut self, v: U64) {
        self.replica_num = v.0;
    }
    #[getter]
    fn get_nof_replica_num(&self) -> u64 {
        self.nof_replica_num
    }
    #[setter]
    fn set_nof_replica_num(&mut self, v: U64) {
        self.nof_replica_num = v.0;
    }
    #[getter]
    fn get_dfs_replica_num(&self) -> u64 {
        self.dfs_replica_num
    }
    #[setter]
    fn set_dfs_replica_num(&mut self, v: U64) {
        self.dfs_replica_num = v.0;
    }
    #[getter]
    fn get_soft_pin_action(&self) -> SoftPinAction {
        self.soft_pin_action
    }
    #[setter]
    fn set_soft_pin_action(&mut self, v: SoftPinAction) {
        self.soft_pin_action = v;
    }
    #[getter]
    fn get_soft_pin_ttl_ms(&self) -> Option<u64> {
        self.soft_pin_ttl_ms
    }
    #[setter]
    fn set_soft_pin_ttl_ms(&mut self, v: Option<U64>) {
        self.soft_pin_ttl_ms = v.map(|v| v.0);
    }
    #[getter]
    fn get_with_hard_pin(&self) -> bool {
        self.with_hard_pin
    }
    #[setter]
    fn set_with_hard_pin(&mut self, v: bool) {
        self.with_hard_pin = v;
    }
    #[getter]
    fn get_preferred_segments(&self) -> Vec<String> {
        self.preferred_segments.clone()
    }
    #[setter]
    fn set_preferred_segments(&mut self, v: Vec<String>) {
        self.preferred_segments = v;
    }
    #[getter]
    fn get_preferred_nof_segments(&self) -> Vec<String> {
        self.preferred_nof_segments.clone()
    }
    #[setter]
    fn set_preferred_nof_segments(&mut self, v: Vec<String>) {
        self.preferred_nof_segments = v;
    }
    #[getter]
    fn get_preferred_segment(&self) -> String {
        self.preferred_segment.clone()
    }
    #[setter]
    fn set_preferred_segment(&mut self, v: String) {
        self.preferred_segment = v;
    }
    #[getter]
    fn get_prefer_alloc_in_same_node(&self) -> bool {
        self.prefer_alloc_in_same_node
    }
    #[setter]
    fn set_prefer_alloc_in_same_node(&mut self, v: bool) {
        self.prefer_alloc_in_same_node = v;
    }
    #[getter]
    fn get_data_type(&self) -> ObjectDataType {
        self.data_type
    }
    #[setter]
    fn set_data_type(&mut self, v: ObjectDataType) {
        self.data_type = v;
    }
    #[getter]
    fn get_group_ids(&self) -> Option<Vec<String>> {
        self.group_ids.clone()
    }
    #[setter]
    fn set_group_ids(&mut self, v: Option<Vec<String>>) {
        self.group_ids = v;
    }

    /// Upstream's `operator<<` text (spec §2).
    fn __str__(&self) -> String {
        let list = |v: &[String]| format!("[{}]", v.join(", "));
        let mut s = format!(
            "ReplicateConfig: {{ replica_num: {}, nof_replica_num: {}, dfs_replica_num: {}, soft_pin_action: {}, soft_pin_ttl_ms: {}, with_hard_pin: {}, preferred_segments: {}",
            self.replica_num,
            self.nof_replica_num,
            self.dfs_replica_num,
            self.soft_pin_action.name_str(),
            self.soft_pin_ttl_ms.map_or("default".to_string(), |t| t.to_string()),
            u8::from(self.with_hard_pin),
            list(&self.preferred_segments),
        );
        if !self.preferred_segment.is_empty() {
            s += &format!(
                ", preferred_segment (deprecated): {}",
                self.preferred_segment
            );
        }
        s += &format!(
            ", preferred_nof_segments: {}, prefer_alloc_in_same_node: {}, data_type: {}",
            list(&self.preferred_nof_segments),
            u8::from(self.prefer_alloc_in_same_node),
            self.data_type.name_str(),
        );
        if let Some(ids) = &self.group_ids {
            s += &format!(", group_ids: {}", list(ids));
        }
        s + " }"
    }
}

impl PyReplicateConfig {
    /// The client's config for a write of `key_count` keys. `INVALID_PARAMS` for what this
    /// library cannot honour or upstream rejects: `group_ids` of another length than the
    /// batch, NVMe-oF / DFS replicas (not built), or no replica at all.
    pub fn to_client(&self, key_count: usize) -> Result<types::ReplicateConfig> {
        if let Some(ids) = &self.group_ids {
            if ids.len() != key_count {
                return fail(
                    ErrorCode::InvalidParams,
                    format!("group_ids has {} entries for {key_count} keys", ids.len()),
                );
            }
        }
        if self.nof_replica_num != 0 || self.dfs_replica_num != 0 {
            return fail(
                ErrorCode::InvalidParams,
                "NVMe-oF and DFS replicas are not built in mooncake-rs (nof_replica_num and dfs_replica_num must be 0)",
            );
        }
        Ok(types::ReplicateConfig {
            replica_num: self.replica_num,
            soft_pin_action: match self.soft_pin_action {
                SoftPinAction::PRESERVE => types::SoftPinAction::Preserve,
                SoftPinAction::ENABLE => types::SoftPinAction::Enable,
                SoftPinAction::DISABLE => types::SoftPinAction::Disable,
            },
            soft_pin_ttl_ms: self.soft_pin_ttl_ms,
            with_hard_pin: self.with_hard_pin,
            preferred_segments: self.preferred_segments.clone(),
            preferred_segment: self.preferred_segment.clone(),
            prefer_alloc_in_same_node: self.prefer_alloc_in_same_node,
        })
    }
}

/// The config argument of a write: `None` (a harmless superset of upstream) means defaults.
pub fn client_config(
    config: Option<&PyReplicateConfig>,
    key_count: usize,
) -> Result<types::ReplicateConfig> {
    match config {
        Some(c) => c.to_client(key_count),
        None => PyReplicateConfig::default().to_client(key_count),
    }
}
