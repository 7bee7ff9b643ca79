//! The RealClient: setup/teardown, put/get families, sessions, registration.
