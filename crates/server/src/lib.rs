//! blockwire's control plane as a library (being built: issue 32 step 1).
