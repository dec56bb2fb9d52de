//! Watches and lists that survive objects the controller cannot decode.
//!
//! The CRDs' schemas admit only what the Rust types read (a test walks every field), but a
//! cluster may run an older or hand-edited CRD. A typed watch fails as a whole on one object
//! it cannot decode — every list is refused and nothing of that kind is served. Here each
//! object is decoded on its own ([`Lenient`]): the ones that decode are served as usual, an
//! undecodable one is dropped from the cache (a stale copy must not be acted on) and
//! reported once per change: condition `Ready=False` with reason [`REASON`] and the decode
//! error, a Warning Event, and a log line.

use futures::channel::mpsc;
use futures::{Stream, TryStreamExt};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::NamespaceResourceScope;
use kube::api::{Api, ApiResource, ListParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Client, Resource};
use serde::de::{DeserializeOwned, Error as _};
use serde::{Deserialize, Deserializer};
use std::borrow::Cow;

/// Condition reason (and Event reason) of an object the controller cannot decode.
pub(crate) const REASON: &str = "InvalidSpec";

/// Field manager of the `InvalidSpec` condition: apart from the controller's own, so
/// writing it never drops status fields (a claim's VM and type) the controller owns.
pub(crate) const FIELD_MANAGER: &str = "autonodes-invalid-spec";

/// An object of kind `K` as read from the API: decoded, or its metadata and why not.
#[derive(Clone, Debug)]
pub(crate) enum Lenient<K> {
    /// The object decoded into `K`.
    Valid(K),
    /// The object did not decode.
    Invalid(Box<Invalid>),
}

/// What is known of an object that did not decode.
#[derive(Clone, Debug)]
pub(crate) struct Invalid {
    /// Its metadata (the API server guarantees it is well formed).
    pub meta: ObjectMeta,
    /// The decode error, with the path of the field (`spec.disruption.consolidateAfter: …`).
    pub error: String,
    /// Its status as stored, to tell whether the error was reported already.
    pub status: Option<serde_json::Value>,
}

impl<K> Lenient<K> {
    /// The decoded object, if it decoded.
    pub(crate) fn valid(self) -> Option<K> {
        match self {
            Lenient::Valid(k) => Some(k),
            Lenient::Invalid(_) => None,
        }
    }
}

impl<'de, K: DeserializeOwned> Deserialize<'de> for Lenient<K> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let value = serde_json::Value::deserialize(d)?;
        match serde_path_to_error::deserialize::<_, K>(&value) {
            Ok(k) => Ok(Lenient::Valid(k)),
            Err(e) => {
                let meta = value
                    .get("metadata")
                    .map(ObjectMeta::deserialize)
                    .transpose()
                    .map_err(D::Error::custom)?
                    .unwrap_or_default();
                Ok(Lenient::Invalid(Box::new(Invalid {
                    meta,
                    error: e.to_string(),
                    status: value.get("status").cloned(),
                })))
            }
        }
    }
}

impl<K: Resource<DynamicType = ()>> Resource for Lenient<K> {
    type DynamicType = ();
    type Scope = K::Scope;

    fn kind(_: &()) -> Cow<'_, str> {
        K::kind(&())
    }
    fn group(_: &()) -> Cow<'_, str> {
        K::group(&())
    }
    fn version(_: &()) -> Cow<'_, str> {
        K::version(&())
    }
    fn plural(_: &()) -> Cow<'_, str> {
        K::plural(&())
    }
    fn meta(&self) -> &ObjectMeta {
        match self {
            Lenient::Valid(k) => k.meta(),
            Lenient::Invalid(i) => &i.meta,
        }
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        match self {
            Lenient::Valid(k) => k.meta_mut(),
            Lenient::Invalid(i) => &mut i.meta,
        }
    }
}

/// An undecodable object to report, with its kind.
#[derive(Clone, Debug)]
pub(crate) struct Report {
    /// The object's kind and where its API is.
    pub resource: ApiResource,
    /// What is known of the object.
    pub object: Box<Invalid>,
}

/// Where undecodable objects are reported: the task running [`crate::controller::invalid::report`].
pub(crate) type Reports = mpsc::UnboundedSender<Report>;

/// `Api::all` for `K`, each object decoded on its own.
pub(crate) fn api_all<K>(client: &Client) -> Api<Lenient<K>>
where
    K: Resource<DynamicType = ()> + DeserializeOwned + Clone + std::fmt::Debug,
{
    Api::all(client.clone())
}

/// The objects of `K` in `namespace` matching `params` that decode; the others are
/// skipped (their watch reports them).
pub(crate) async fn list<K>(
    client: &Client,
    namespace: &str,
    params: &ListParams,
) -> Result<Vec<K>, kube::Error>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>,
    K: DeserializeOwned + Clone + std::fmt::Debug,
{
    Ok(Api::<Lenient<K>>::namespaced(client.clone(), namespace)
        .list(params)
        .await?
        .items
        .into_iter()
        .filter_map(Lenient::valid)
        .collect())
}

/// The object `name` of `K` in `namespace` as read (decoded or not), if it exists.
pub(crate) async fn get<K>(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<Option<Lenient<K>>, kube::Error>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>,
    K: DeserializeOwned + Clone + std::fmt::Debug,
{
    Api::<Lenient<K>>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await
}

/// A watch of every `K` as typed events, for one [`Writer`](kube::runtime::reflector::store::Writer)
/// whose store `cache` reads: objects that do not decode are sent to `reports` (when given)
/// and left out, and their last decodable copy in `cache` gets a `Delete` first (a stale
/// copy must not be acted on). Retries with backoff after errors.
pub(crate) fn events<K>(
    client: &Client,
    cache: Store<K>,
    reports: Option<Reports>,
) -> impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send
where
    K: Resource<DynamicType = ()> + DeserializeOwned + Clone + std::fmt::Debug + Send + Sync,
    K: 'static,
{
    let resource = ApiResource::erase::<K>(&());
    watcher(api_all::<K>(client), watch_config())
        .default_backoff()
        .map_ok(move |event| {
            let (event, stale, invalid) = split(event, &cache);
            if let (Some(object), Some(reports)) = (invalid, reports.as_ref()) {
                let _ = reports.unbounded_send(Report {
                    resource: resource.clone(),
                    object,
                });
            }
            let stale = stale.map(watcher::Event::Delete);
            futures::stream::iter(stale.into_iter().chain(event).map(Ok))
        })
        .try_flatten()
}

/// A watch event of `Lenient<K>` as the typed event to pass on (none for an undecodable
/// object), the cached copy to drop, and the undecodable object.
fn split<K>(
    event: watcher::Event<Lenient<K>>,
    cache: &Store<K>,
) -> (Option<watcher::Event<K>>, Option<K>, Option<Box<Invalid>>)
where
    K: Resource<DynamicType = ()> + Clone,
{
    let cached = |meta: &ObjectMeta| {
        let mut r = ObjectRef::<K>::new(meta.name.as_deref().unwrap_or_default());
        if let Some(ns) = &meta.namespace {
            r = r.within(ns);
        }
        cache.get(&r).map(|k| (*k).clone())
    };
    use watcher::Event as E;
    match event {
        E::Init => (Some(E::Init), None, None),
        E::InitDone => (Some(E::InitDone), None, None),
        E::InitApply(Lenient::Valid(k)) => (Some(E::InitApply(k)), None, None),
        E::Apply(Lenient::Valid(k)) => (Some(E::Apply(k)), None, None),
        E::Delete(Lenient::Valid(k)) => (Some(E::Delete(k)), None, None),
        // A relist replaces the cache at InitDone: leaving the object out drops it.
        E::InitApply(Lenient::Invalid(i)) => (None, None, Some(i)),
        E::Apply(Lenient::Invalid(i)) => (None, cached(&i.meta), Some(i)),
        E::Delete(Lenient::Invalid(i)) => (None, cached(&i.meta), None),
    }
}

/// The watcher configuration of every controller.
pub(crate) fn watch_config() -> watcher::Config {
    watcher::Config::default().any_semantic()
}

#[cfg(test)]
mod tests {
    use super::*;
    use autonodes_api::NodePool;

    fn pool(consolidate_after: &str) -> serde_json::Value {
        serde_json::json!({
            "apiVersion": "autonodes.io/v1alpha1",
            "kind": "NodePool",
            "metadata": {"name": "p", "namespace": "t", "uid": "u1"},
            "spec": {"providerRef": "p", "vClusterRef": {"name": "t"},
                     "disruption": {"consolidateAfter": consolidate_after}},
            "status": {"conditions": [{"type": "Ready", "status": "False",
                "reason": "InvalidSpec", "message": "m", "lastTransitionTime": "2026-01-01T00:00:00Z"}]},
        })
    }

    #[test]
    fn an_object_that_decodes_is_valid_and_one_that_does_not_keeps_its_metadata_and_the_field_path()
    {
        let ok: Lenient<NodePool> = serde_json::from_value(pool("30s")).unwrap();
        assert!(matches!(ok, Lenient::Valid(_)));
        let bad: Lenient<NodePool> = serde_json::from_value(pool("soon")).unwrap();
        let Lenient::Invalid(i) = bad else {
            panic!("decoded")
        };
        assert_eq!(i.meta.name.as_deref(), Some("p"));
        assert_eq!(i.meta.uid.as_deref(), Some("u1"));
        assert!(
            i.error.starts_with("spec.disruption.consolidateAfter"),
            "{}",
            i.error
        );
    }

    #[test]
    fn a_list_with_one_undecodable_object_still_decodes_the_others() {
        let list = serde_json::json!([pool("30s"), pool("soon"), pool("Never")]);
        let items: Vec<Lenient<NodePool>> = serde_json::from_value(list).unwrap();
        let valid = items.into_iter().filter_map(Lenient::valid).count();
        assert_eq!(valid, 2);
    }

    #[test]
    fn an_undecodable_update_drops_the_cached_copy_and_a_relist_leaves_it_out() {
        let mut writer = kube::runtime::reflector::store::Writer::<NodePool>::default();
        let reader = writer.as_reader();
        let good: NodePool = serde_json::from_value(pool("30s")).unwrap();
        writer.apply_watcher_event(&watcher::Event::Apply(good));
        assert_eq!(reader.state().len(), 1);
        let bad: Lenient<NodePool> = serde_json::from_value(pool("soon")).unwrap();
        let (event, stale, invalid) = split(watcher::Event::Apply(bad.clone()), &reader);
        assert!(event.is_none());
        assert!(invalid.is_some());
        writer.apply_watcher_event(&watcher::Event::Delete(stale.unwrap()));
        assert!(reader.state().is_empty());
        let (event, stale, invalid) = split(watcher::Event::InitApply(bad), &reader);
        assert!(event.is_none() && stale.is_none() && invalid.is_some());
    }
}
