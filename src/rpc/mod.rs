//! The wire: framing and encoding of master RPCs, the tokio server and the client.
