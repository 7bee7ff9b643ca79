//! RPC interfaces declared as one list each.
//!
//! [`rpc_interface!`] turns a list of method signatures into: the service trait, the wire
//! enums (`Request` with one variant per method and its arguments, `Response` with one
//! variant per method holding its answer), a marker type implementing [`Interface`] (used by
//! the generic [`crate::rpc::RpcServer::serve`] and [`crate::rpc::RpcClient`]) and a
//! `Remote<C>` forwarding implementation of the trait over any [`Call`] transport; with a
//! `forward` line also a `Forward<F>` implementation that calls another implementation
//! directly after a hook (the client counts its master calls so, without building requests). The
//! master's interface (`crate::master::MasterApi`) and the P2P owner's interface
//! (`crate::p2p::PeerApi`) are both declared this way, so a server, its client and the
//! in-process implementation cannot drift apart.
//!
//! Convention every list must follow: each method returns `Result<_>` (the server's
//! metrics read the `Result` tag of the encoded answer, see
//! [`crate::rpc::codec::enum_result_error`]).

use crate::error::Result;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::fmt::Debug;

/// One RPC interface: its service trait and wire enums. Implemented by the marker type that
/// [`rpc_interface!`] generates; never implemented by hand.
pub trait Interface: 'static {
    /// The service trait object (`dyn MasterApi`, `dyn PeerApi`).
    type Api: ?Sized + Send + Sync;
    /// One call, as sent over the wire.
    type Request: Serialize + DeserializeOwned + Send + Debug;
    /// The answer to a call.
    type Response: Serialize + DeserializeOwned + Send + Debug;
    /// Name used for server threads and logs.
    const NAME: &'static str;
    /// Whether clients open TLS to this service when the process trusts certificates
    /// ([`crate::auth::tls`]): the master's interface only.
    const TLS: bool = false;
    /// Runs `request` against `api` and wraps the answer.
    fn dispatch(request: Self::Request, api: &Self::Api) -> Self::Response;
    /// The method name of `request` (metrics, logs).
    fn method(request: &Self::Request) -> &'static str;
}

/// Sends one request of interface `I` and returns its answer; transport errors are
/// `RPC_FAIL` / `RPC_TIMEOUT`. Implemented by [`crate::rpc::RpcClient`]. Thread-safe.
pub trait Call<I: Interface>: Send + Sync {
    /// Performs one round trip.
    fn call(&self, request: I::Request) -> Result<I::Response>;
}

/// Declares an RPC interface from one list of methods; see the module documentation.
macro_rules! rpc_interface {
    (
        $(#[$idoc:meta])* interface $iface:ident = $label:literal $(, tls = $tls:literal)?;
        $(#[$tdoc:meta])* trait $api:ident;
        request $req:ident;
        response $resp:ident;
        $(#[$rdoc:meta])* remote $remote:ident;
        $(#[$fdoc:meta])* forward $forward:ident;
        $( $(#[$doc:meta])* fn $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) -> $ret:ty; )*
    ) => {
        $crate::rpc::interface::rpc_interface! {
            $(#[$idoc])* interface $iface = $label $(, tls = $tls)?;
            $(#[$tdoc])* trait $api;
            request $req;
            response $resp;
            $(#[$rdoc])* remote $remote;
            $( $(#[$doc])* fn $name ( $($arg : $ty),* ) -> $ret; )*
        }

        $(#[$fdoc])*
        pub struct $forward<F> {
            inner: ::std::sync::Arc<dyn $api>,
            before_call: F,
        }

        impl<F: Fn() + Send + Sync> $forward<F> {
            /// Forwards every call to `inner` directly (no request is built), after
            /// `before_call` ran.
            pub fn new(inner: ::std::sync::Arc<dyn $api>, before_call: F) -> $forward<F> {
                $forward { inner, before_call }
            }
        }

        impl<F: Fn() + Send + Sync> $api for $forward<F> {
            $(
                fn $name(&self, $($arg: $ty),*) -> $ret {
                    (self.before_call)();
                    self.inner.$name($($arg),*)
                }
            )*
        }
    };
    (
        $(#[$idoc:meta])* interface $iface:ident = $label:literal $(, tls = $tls:literal)?;
        $(#[$tdoc:meta])* trait $api:ident;
        request $req:ident;
        response $resp:ident;
        $(#[$rdoc:meta])* remote $remote:ident;
        $( $(#[$doc:meta])* fn $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) -> $ret:ty; )*
    ) => {
        $(#[$tdoc])*
        pub trait $api: Send + Sync {
            $( $(#[$doc])* fn $name(&self, $($arg: $ty),*) -> $ret; )*
        }

        /// One call, as sent over the wire.
        #[allow(non_camel_case_types, missing_docs)]
        #[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
        pub enum $req {
            $( $name { $($arg: $ty),* }, )*
        }

        /// The answer to a request of the same name.
        #[allow(non_camel_case_types, missing_docs)]
        #[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
        pub enum $resp {
            $( $name($ret), )*
        }

        $(#[$idoc])*
        pub struct $iface;

        impl $crate::rpc::Interface for $iface {
            type Api = dyn $api;
            type Request = $req;
            type Response = $resp;
            const NAME: &'static str = $label;
            $(const TLS: bool = $tls;)?

            fn dispatch(request: $req, api: &dyn $api) -> $resp {
                match request {
                    $( $req::$name { $($arg),* } => $resp::$name(api.$name($($arg),*)), )*
                }
            }

            fn method(request: &$req) -> &'static str {
                match request { $( $req::$name { .. } => stringify!($name), )* }
            }
        }

        $(#[$rdoc])*
        pub struct $remote<C>(pub C);

        impl<C: $crate::rpc::Call<$iface>> $api for $remote<C> {
            $(
                fn $name(&self, $($arg: $ty),*) -> $ret {
                    match self.0.call($req::$name { $($arg),* })? {
                        $resp::$name(answer) => answer,
                        #[allow(unreachable_patterns)]
                        other => {
                            tracing::error!(expected = stringify!($name), got = ?other, "mismatched RPC response");
                            Err($crate::error::ErrorCode::RpcFail)
                        }
                    }
                }
            )*
        }
    };
}
pub(crate) use rpc_interface;
