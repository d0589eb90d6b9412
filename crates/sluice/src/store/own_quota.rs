//! Keys with a quota of their own in a table of [`AnyAlgorithm`]s (the memory and file
//! stores): the quota given as a [`Quota`], held under the table's algorithm kind, and moved
//! to another kind with the table.

use sluice_core::{Algorithm, AnyAlgorithm, Quota};

use crate::keyed::Keyed;

/// Sets `key`'s own quota (`None`: removes it), converting its state (see
/// [`Keyed::set_override`]); returns its previous one.
pub(crate) fn set(
    keyed: &Keyed<String, AnyAlgorithm>,
    key: &str,
    quota: Option<Quota>,
) -> Option<Quota> {
    let kind = keyed.algorithm().kind();
    keyed
        .set_override(key.to_owned(), quota.map(|q| AnyAlgorithm::new(kind, q)))
        .map(|a| a.quota())
}

/// Every key's own quota, sorted by key.
pub(crate) fn list(keyed: &Keyed<String, AnyAlgorithm>) -> Vec<(String, Quota)> {
    let mut all: Vec<(String, Quota)> = keyed
        .overrides()
        .into_iter()
        .map(|(k, a)| (k, a.quota()))
        .collect();
    all.sort_by(|a, b| a.0.cmp(&b.0));
    all
}

/// After the table changed algorithm kind: each key's own quota under the new kind, its state
/// converted ([`Keyed::reconfigure`] leaves such keys as they were).
pub(crate) fn follow_kind(keyed: &Keyed<String, AnyAlgorithm>) {
    let kind = keyed.algorithm().kind();
    for (key, own) in keyed.overrides() {
        if own.kind() != kind {
            keyed.set_override(key, Some(AnyAlgorithm::new(kind, own.quota())));
        }
    }
}

#[cfg(test)]
mod tests {
    use sluice_core::{AnyAlgorithm, Kind, Quota};

    use crate::store::{MemoryStore, Store};

    #[tokio::test(start_paused = true)]
    async fn a_key_with_its_own_quota_is_decided_by_it_and_converted_both_ways() {
        let alg = AnyAlgorithm::new(Kind::Gcra, Quota::parse(2, "1/h").unwrap());
        let store = MemoryStore::new(alg, 100, 0, std::time::Duration::ZERO);
        store.set_override("vip", Some(Quota::parse(5, "1/h").unwrap()));
        for i in 0..5 {
            assert!(store.check("vip", 1).await.is_ok(), "request {i}");
        }
        assert!(store.check("vip", 1).await.is_err());
        assert!(store.check("other", 2).await.is_ok());
        assert!(store.check("other", 1).await.is_err());
        store.set_override("vip", None);
        assert_eq!(
            store.peek("vip").await.unwrap().remaining,
            0,
            "no tokens gained"
        );
    }
}
