//! The module's enums (spec §3): `SoftPinAction`, `ObjectDataType`, `ReplicaStatus`,
//! `TaskType`, `TaskStatus`. Like pybind11's `py::enum_`: `E.MEMBER`, `.name`, `.value`,
//! `int(x)`, `E(value)`, hashable, `repr` `<E.MEMBER: v>`, `str` `E.MEMBER`, strict `==`
//! (a member never equals an `int`), and `E.__members__` (set up by [`add_enums`]).

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// Declares one enum with its members in registration order (the order of `__members__`).
macro_rules! py_enum {
    ($(#[$doc:meta])* $name:ident { $($member:ident = $value:literal),+ $(,)? }) => {
        $(#[$doc])*
        #[pyclass(eq, hash, frozen, from_py_object, module = "mooncake.store")]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[allow(non_camel_case_types, clippy::upper_case_acronyms)]
        pub enum $name {
            $($member = $value),+
        }

        impl $name {
            /// Every member with its name, in registration order.
            pub const MEMBERS: &'static [(&'static str, $name)] = &[$((stringify!($member), $name::$member)),+];

            pub fn name_str(self) -> &'static str {
                match self {
                    $($name::$member => stringify!($member)),+
                }
            }
        }

        #[pymethods]
        impl $name {
            /// `E(value)`: the member with this value; `ValueError` for any other.
            #[new]
            fn from_value(value: i64) -> PyResult<Self> {
                Self::MEMBERS
                    .iter()
                    .find(|(_, m)| *m as i64 == value)
                    .map(|(_, m)| *m)
                    .ok_or_else(|| {
                        PyValueError::new_err(format!("{value} is not a valid {}", stringify!($name)))
                    })
            }

            /// The member's name.
            #[getter]
            fn name(&self) -> &'static str {
                self.name_str()
            }

            /// The member's value.
            #[getter]
            fn value(&self) -> i64 {
                *self as i64
            }

            fn __int__(&self) -> i64 {
                *self as i64
            }

            fn __index__(&self) -> i64 {
                *self as i64
            }

            fn __repr__(&self) -> String {
                format!("<{}.{}: {}>", stringify!($name), self.name_str(), *self as i64)
            }

            fn __str__(&self) -> String {
                format!("{}.{}", stringify!($name), self.name_str())
            }
        }
    };
}

py_enum!(
    /// Soft-pin transition requested by a put/upsert (`ReplicateConfig.soft_pin_action`).
    SoftPinAction { PRESERVE = 0, ENABLE = 1, DISABLE = 2 }
);
py_enum!(
    /// Classification tag of an object (`ReplicateConfig.data_type`).
    ObjectDataType {
        UNKNOWN = 0, KVCACHE = 1, TENSOR = 2, WEIGHT = 3, SAMPLE = 4, ACTIVATION = 5,
        GRADIENT = 6, OPTIMIZER_STATE = 7, METADATA = 8, GENERAL = 9,
    }
);
py_enum!(
    /// A replica's state (`ReplicaDescriptor.status`).
    ReplicaStatus { UNDEFINED = 0, INITIALIZED = 1, PROCESSING = 2, COMPLETE = 3, REMOVED = 4, FAILED = 5 }
);
py_enum!(
    /// Kind of a replication task (copy/move tasks are not built in mooncake-rs).
    TaskType { REPLICA_COPY = 0, REPLICA_MOVE = 1 }
);
py_enum!(
    /// State of a replication task; registered in pybind's order (values as in C++).
    TaskStatus { PENDING = 0, PROCESSING = 1, SUCCESS = 3, FAILED = 2 }
);

/// Adds one enum class, its `__members__` mapping and, with `export`, its members at module
/// scope (pybind's `export_values()`: a later enum overwrites an earlier one's names).
fn add_enum<T: pyo3::PyClass>(
    m: &Bound<'_, PyModule>,
    members: &[(&str, T)],
    export: bool,
) -> PyResult<()> {
    m.add_class::<T>()?;
    let class = m.py().get_type::<T>();
    let mapping = PyDict::new(m.py());
    for (name, _) in members {
        let member = class.getattr(*name)?;
        mapping.set_item(name, &member)?;
        if export {
            m.add(*name, member)?;
        }
    }
    class.setattr("__members__", mapping)?;
    Ok(())
}

/// Registers the five enums in upstream's order.
pub fn add_enums(m: &Bound<'_, PyModule>) -> PyResult<()> {
    add_enum(m, SoftPinAction::MEMBERS, false)?;
    add_enum(m, ObjectDataType::MEMBERS, true)?;
    add_enum(m, ReplicaStatus::MEMBERS, true)?;
    add_enum(m, TaskType::MEMBERS, true)?;
    add_enum(m, TaskStatus::MEMBERS, true)
}
