//! Mooncake's error numbering (`ErrorCode` in `mooncake-store/include/types.h`) and the
//! crate-wide `Result` type.
//!
//! Every fallible operation in the library returns [`Result<T>`]; the error is an
//! [`ErrorCode`] whose integer value is exactly Mooncake's, so the C surface returns it as is.
//! A human-readable detail for the most recent failure on the calling thread is recorded by
//! [`fail`] and read back with [`last_error_message`] (`mc_last_error_message` in C).

use serde::{Deserialize, Serialize};
use std::cell::RefCell;
use std::fmt;

macro_rules! error_codes {
    ($( $name:ident = $value:literal => $text:literal, )*) => {
        /// Mooncake's `ErrorCode`: 0 for OK, negative `i32` values for errors.
        #[repr(i32)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
        pub enum ErrorCode {
            $( #[doc = $text] $name = $value, )*
        }

        impl ErrorCode {
            /// Every code, in declaration order.
            pub const ALL: &'static [ErrorCode] = &[$(ErrorCode::$name,)*];

            /// Mooncake's name for the code (`toString` in the C++ code base), e.g.
            /// `"OBJECT_NOT_FOUND"`.
            pub fn name(self) -> &'static str {
                match self { $( ErrorCode::$name => $text, )* }
            }

            /// The code for an integer, if it is one of Mooncake's.
            pub fn from_i32(value: i32) -> Option<ErrorCode> {
                match value { $( $value => Some(ErrorCode::$name), )* _ => None }
            }
        }
    };
}

error_codes! {
    Ok = 0 => "OK",
    InternalError = -1 => "INTERNAL_ERROR",
    BufferOverflow = -10 => "BUFFER_OVERFLOW",
    ShardIndexOutOfRange = -100 => "SHARD_INDEX_OUT_OF_RANGE",
    SegmentNotFound = -101 => "SEGMENT_NOT_FOUND",
    SegmentAlreadyExists = -102 => "SEGMENT_ALREADY_EXISTS",
    ClientNotFound = -103 => "CLIENT_NOT_FOUND",
    NoAvailableHandle = -200 => "NO_AVAILABLE_HANDLE",
    InvalidVersion = -300 => "INVALID_VERSION",
    InvalidKey = -400 => "INVALID_KEY",
    WriteFail = -500 => "WRITE_FAIL",
    InvalidParams = -600 => "INVALID_PARAMS",
    IllegalClient = -601 => "ILLEGAL_CLIENT",
    InvalidWrite = -700 => "INVALID_WRITE",
    InvalidRead = -701 => "INVALID_READ",
    InvalidReplica = -702 => "INVALID_REPLICA",
    ReplicaIsNotReady = -703 => "REPLICA_IS_NOT_READY",
    ObjectNotFound = -704 => "OBJECT_NOT_FOUND",
    ObjectAlreadyExists = -705 => "OBJECT_ALREADY_EXISTS",
    ObjectHasLease = -706 => "OBJECT_HAS_LEASE",
    LeaseExpired = -707 => "LEASE_EXPIRED",
    ObjectHasReplicationTask = -708 => "OBJECT_HAS_REPLICATION_TASK",
    ObjectNoReplicationTask = -709 => "OBJECT_NO_REPLICATION_TASK",
    ReplicaNotFound = -710 => "REPLICA_NOT_FOUND",
    ReplicaAlreadyExists = -711 => "REPLICA_ALREADY_EXISTS",
    ReplicaIsGone = -712 => "REPLICA_IS_GONE",
    ReplicaNotInLocalMemory = -713 => "REPLICA_NOT_IN_LOCAL_MEMORY",
    ObjectReplicaBusy = -714 => "OBJECT_REPLICA_BUSY",
    TransferFail = -800 => "TRANSFER_FAIL",
    ChecksumMismatch = -801 => "CHECKSUM_MISMATCH",
    RpcFail = -900 => "RPC_FAIL",
    RpcTimeout = -901 => "RPC_TIMEOUT",
    EtcdOperationError = -1000 => "ETCD_OPERATION_ERROR",
    EtcdKeyNotExist = -1001 => "ETCD_KEY_NOT_EXIST",
    EtcdTransactionFail = -1002 => "ETCD_TRANSACTION_FAIL",
    EtcdCtxCancelled = -1003 => "ETCD_CTX_CANCELLED",
    OplogEntryNotFound = -1004 => "OPLOG_ENTRY_NOT_FOUND",
    K8sLeaseOperationError = -1005 => "K8S_LEASE_OPERATION_ERROR",
    K8sLeaseNotFound = -1006 => "K8S_LEASE_NOT_FOUND",
    IncompleteOplogCatchUp = -1007 => "INCOMPLETE_OPLOG_CATCH_UP",
    UnavailableInCurrentStatus = -1010 => "UNAVAILABLE_IN_CURRENT_STATUS",
    UnavailableInCurrentMode = -1011 => "UNAVAILABLE_IN_CURRENT_MODE",
    NotSupported = -1012 => "NOT_SUPPORTED",
    FileNotFound = -1100 => "FILE_NOT_FOUND",
    FileOpenFail = -1101 => "FILE_OPEN_FAIL",
    FileReadFail = -1102 => "FILE_READ_FAIL",
    FileWriteFail = -1103 => "FILE_WRITE_FAIL",
    FileInvalidBuffer = -1104 => "FILE_INVALID_BUFFER",
    FileLockFail = -1105 => "FILE_LOCK_FAIL",
    FileInvalidHandle = -1106 => "FILE_INVALID_HANDLE",
    BucketNotFound = -1200 => "BUCKET_NOT_FOUND",
    BucketAlreadyExists = -1201 => "BUCKET_ALREADY_EXISTS",
    KeysExceedBucketLimit = -1202 => "KEYS_EXCEED_BUCKET_LIMIT",
    KeysUltraLimit = -1203 => "KEYS_ULTRA_LIMIT",
    UnableOffload = -1300 => "UNABLE_OFFLOAD",
    UnableOffloading = -1301 => "UNABLE_OFFLOADING",
    TaskNotFound = -1400 => "TASK_NOT_FOUND",
    TaskPendingLimitExceeded = -1401 => "TASK_PENDING_LIMIT_EXCEEDED",
    JobNotFound = -1402 => "JOB_NOT_FOUND",
    SerializeUnsupported = -1500 => "SERIALIZE_UNSUPPORTED",
    SerializeFail = -1501 => "SERIALIZE_FAIL",
    DeserializeFail = -1502 => "DESERIALIZE_FAIL",
    PersistentFail = -1503 => "PERSISTENT_FAIL",
    DfsNetworkTimeout = -1600 => "DFS_NETWORK_TIMEOUT",
    DfsServiceUnavailable = -1601 => "DFS_SERVICE_UNAVAILABLE",
    DfsQuotaExceeded = -1602 => "DFS_QUOTA_EXCEEDED",
    DfsPermissionDenied = -1603 => "DFS_PERMISSION_DENIED",
    DfsStaleHandle = -1604 => "DFS_STALE_HANDLE",
    DfsPartialWrite = -1605 => "DFS_PARTIAL_WRITE",
    TenantQuotaExceeded = -1700 => "TENANT_QUOTA_EXCEEDED",
    TenantNotRegistered = -1701 => "TENANT_NOT_REGISTERED",
    TenantNotEmpty = -1702 => "TENANT_NOT_EMPTY",
    // mooncake-rs codes (not in Mooncake's table; -9000 and below stay clear of its ranges).
    TryAgain = -9001 => "TRY_AGAIN",
    StreamCaptureUnsupported = -9002 => "STREAM_CAPTURE_UNSUPPORTED",
    TransferTimeout = -9003 => "TRANSFER_TIMEOUT",
    Cancelled = -9004 => "CANCELLED",
    StaleWriteToken = -9005 => "STALE_WRITE_TOKEN",
    StaleSegmentEpoch = -9006 => "STALE_SEGMENT_EPOCH",
    AuthFailed = -9007 => "AUTH_FAILED",
    RevocationPending = -9008 => "REVOCATION_PENDING",
}

impl ErrorCode {
    /// The integer value Mooncake uses for this code.
    pub fn code(self) -> i32 {
        self as i32
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name(), self.code())
    }
}

impl std::error::Error for ErrorCode {}

/// The crate-wide result: a value or one of Mooncake's error codes.
pub type Result<T> = std::result::Result<T, ErrorCode>;

thread_local! {
    static LAST_ERROR: RefCell<String> = const { RefCell::new(String::new()) };
}

/// Records `message` as the calling thread's last error detail, logs it at debug level and
/// returns `Err(code)`. Use at the place where a failure is first detected.
pub fn fail<T>(code: ErrorCode, message: impl fmt::Display) -> Result<T> {
    let text = format!("{}: {}", code.name(), message);
    tracing::debug!(code = code.code(), "{text}");
    LAST_ERROR.with(|slot| *slot.borrow_mut() = text);
    Err(code)
}

/// Records a detail for the calling thread without failing (used by the C layer for its own
/// argument checks).
pub fn set_last_error_message(message: impl fmt::Display) {
    let text = message.to_string();
    LAST_ERROR.with(|slot| *slot.borrow_mut() = text);
}

/// The calling thread's last error detail ("" if none was recorded).
pub fn last_error_message() -> String {
    LAST_ERROR.with(|slot| slot.borrow().clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_through_integers() {
        for &code in ErrorCode::ALL {
            assert_eq!(ErrorCode::from_i32(code.code()), Some(code));
        }
        assert_eq!(ErrorCode::from_i32(-601), Some(ErrorCode::IllegalClient));
        assert_eq!(ErrorCode::from_i32(-2), None);
        assert_eq!(ErrorCode::ObjectHasLease.code(), -706);
        assert_eq!(ErrorCode::ObjectHasLease.name(), "OBJECT_HAS_LEASE");
    }

    #[test]
    fn fail_records_the_detail_per_thread() {
        let r: Result<()> = fail(ErrorCode::InvalidParams, "buffer too small");
        assert_eq!(r, Err(ErrorCode::InvalidParams));
        assert_eq!(last_error_message(), "INVALID_PARAMS: buffer too small");
        std::thread::spawn(|| assert_eq!(last_error_message(), ""))
            .join()
            .unwrap();
    }
}
