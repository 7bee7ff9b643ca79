//! The transfer engine: a table of registered memory and the transports (local copy, TCP)
//! that move bytes between a local buffer and a (possibly remote) registered address.
