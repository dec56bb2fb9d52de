//! The Event recorder: Events (events.k8s.io/v1) about autonodes' objects, written to the
//! management cluster.

use std::sync::atomic::AtomicBool;

use kube::runtime::events::{EventType, Reporter};
use kube::{Api, Client, Resource};

use k8s_openapi::jiff::Timestamp;

/// Records Events about autonodes' objects on the management cluster.
pub(crate) struct Events {
    /// The management-cluster client.
    client: Client,
    /// Who records them (`reportingController`, `reportingInstance`).
    reporter: Reporter,
    /// Where Events about cluster-scoped objects go: `default` (as client-go's and
    /// kube-runtime's recorders put them) until the management API server refuses one
    /// there, as 1.20 servers do; then `kube-system` for the rest of the process.
    cluster_events_in_default: AtomicBool,
}

impl Events {
    /// A recorder writing with `client` as `reporter`.
    pub(crate) fn new(client: Client, reporter: Reporter) -> Self {
        Events {
            client,
            reporter,
            cluster_events_in_default: AtomicBool::new(true),
        }
    }

    /// Records an Event (events.k8s.io/v1) about `obj`; failures to record are logged,
    /// never fatal. Events about cluster-scoped objects go to `default`, where client-go's
    /// and kube-runtime's recorders put them; an API server that refuses them there (1.20
    /// answers 422, `involvedObject.namespace: does not match event.namespace`) gets them
    /// in `kube-system` from then on (see [`Events::cluster_events_in_default`]).
    ///
    /// Written here rather than with kube-runtime's `Recorder`, which on a real API server
    /// (tried with kube 5.0) loses Events autonodes must record: it names an Event
    /// `<object name>.<hex time>`, which passes the 253 characters a name may have for
    /// claims with long names (refused, 422); it sends the note uncut (a note over 1,024
    /// characters is refused); it folds a repeated reason into a series that keeps the
    /// first note, so a second failure's text never shows; and it puts Events about
    /// cluster-scoped objects in `default` only, which a 1.20 API server refuses. Here the
    /// name is shortened
    /// with a hash ([`autonodes_core::names::event_name`]), reason, action and note are
    /// cut to what the API accepts, and each Event carries its own note.
    pub(crate) async fn record<K>(
        &self,
        obj: &K,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) where
        K: Resource<DynamicType = ()>,
    {
        self.record_about(obj.object_ref(&()), type_, reason, action, note)
            .await;
    }

    /// Records an Event about the object `regarding` refers to (see [`Events::record`]).
    pub(crate) async fn record_about(
        &self,
        regarding: k8s_openapi::api::core::v1::ObjectReference,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        use std::sync::atomic::Ordering;
        let cluster_scoped = regarding.namespace.is_none();
        let namespace = match &regarding.namespace {
            Some(ns) => ns.clone(),
            None if self.cluster_events_in_default.load(Ordering::Relaxed) => "default".into(),
            None => "kube-system".into(),
        };
        let now = Timestamp::now();
        let name = autonodes_core::names::event_name(
            regarding.name.as_deref().unwrap_or("autonodes"),
            now.as_nanosecond(),
        );
        let event = k8s_openapi::api::events::v1::Event {
            metadata: kube::api::ObjectMeta {
                name: Some(name),
                namespace: Some(namespace.clone()),
                ..Default::default()
            },
            action: Some(autonodes_api::conditions::cut(action, 128)),
            reason: Some(autonodes_api::conditions::cut(reason, 128)),
            note: Some(autonodes_api::conditions::cut(&note, 1000)),
            type_: Some(match type_ {
                EventType::Normal => "Normal".into(),
                EventType::Warning => "Warning".into(),
            }),
            event_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
                now,
            )),
            regarding: Some(regarding.clone()),
            reporting_controller: Some(self.reporter.controller.clone()),
            reporting_instance: Some(
                self.reporter
                    .instance
                    .clone()
                    .unwrap_or_else(|| self.reporter.controller.clone()),
            ),
            ..Default::default()
        };
        let api: Api<k8s_openapi::api::events::v1::Event> =
            Api::namespaced(self.client.clone(), &namespace);
        let mut result = api.create(&kube::api::PostParams::default(), &event).await;
        let refused_in_default = matches!(&result, Err(kube::Error::Api(s)) if s.code == 422);
        if cluster_scoped && namespace == "default" && refused_in_default {
            self.cluster_events_in_default
                .store(false, Ordering::Relaxed);
            tracing::info!(
                "the management API server refuses Events about cluster-scoped objects in \
                 namespace default (as Kubernetes 1.20 does); recording them in kube-system"
            );
            let mut event = event;
            event.metadata.namespace = Some("kube-system".into());
            let api: Api<k8s_openapi::api::events::v1::Event> =
                Api::namespaced(self.client.clone(), "kube-system");
            result = api.create(&kube::api::PostParams::default(), &event).await;
        }
        if let Err(e) = result {
            tracing::warn!(object = %regarding.name.unwrap_or_default(), error = %e, "recording an event failed");
        }
    }
}
