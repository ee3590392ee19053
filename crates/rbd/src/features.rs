//! RBD image feature bits (librbd's `rbd/features.h`) and their names as `rbd info`
//! prints them.

/// `RBD_FEATURE_EXCLUSIVE_LOCK`: one writer at a time; librbd passes the lock
/// between clients that write.
pub const EXCLUSIVE_LOCK: u64 = 1 << 2;

const NAMES: [(u64, &str); 12] = [
    (1 << 0, "layering"),
    (1 << 1, "striping"),
    (EXCLUSIVE_LOCK, "exclusive-lock"),
    (1 << 3, "object-map"),
    (1 << 4, "fast-diff"),
    (1 << 5, "deep-flatten"),
    (1 << 6, "journaling"),
    (1 << 7, "data-pool"),
    (1 << 8, "operations"),
    (1 << 9, "migrating"),
    (1 << 10, "non-primary"),
    (1 << 11, "dirty-cache"),
];

/// The names of the bits set in `features`, in bit order.
pub fn names(features: u64) -> Vec<&'static str> {
    NAMES
        .iter()
        .filter(|(bit, _)| features & bit != 0)
        .map(|&(_, name)| name)
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn default_features_by_name() {
        // RBD_FEATURES_DEFAULT of Ceph 16: layering, exclusive-lock, object-map,
        // fast-diff, deep-flatten.
        assert_eq!(
            super::names(0x3d),
            [
                "layering",
                "exclusive-lock",
                "object-map",
                "fast-diff",
                "deep-flatten"
            ]
        );
    }
}
