//! NVMe over TCP (being built: issue 33).
