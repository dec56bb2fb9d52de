//! What a claim gets, computed without touching any cluster: the chosen node type, the
//! user-data Secret and the VirtualMachine, and the labels and taints its Node is given.
//!
//! [`plan_node`] chooses a type, then renders; [`render_node`] renders for a type already
//! chosen (the claim's `status.typeRef`). The controller's launch stage calls them with
//! the catalogue it keeps and the tenant's join parameters (endpoint, a freshly minted
//! bootstrap token, the CA hash); `autonodes render` calls them with files.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::ByteString;
use serde_json::Value;

use crate::catalogue::{Catalogue, PreparedType, TypeProblem};
use crate::node_config::{LabelError, NodeLabels, NodeTaints, TaintError};
use crate::properties::{
    PROP_IMAGE_PREPARED, PROP_KUBERNETES_DOWNLOAD_URL, PROP_SSH_KEYS, PROP_USER_DATA,
    PROP_USER_DATA_TEMPLATE,
};
use crate::scheduling::{self, ClaimRequest, NoFit, RequestError};
use crate::template;
use crate::template::error::TemplateError;
use crate::template::names::{VmIdentity, NETWORK_DATA_KEY, USER_DATA_KEY};
use crate::userdata::{self, JoinParams, JoinTemplate, UserDataError, UserDataInput};
use autonodes_api::{NodeClaim, NodePoolSpec};

/// Everything autonodes writes for one claim, and what it sets on the Node afterwards. Its
/// `Debug` leaves the user data (which holds the bootstrap token) out.
#[derive(Clone, PartialEq)]
pub struct RenderedNode {
    /// The chosen NodeType (`<provider>.<type>`).
    pub node_type: String,
    /// Its effective cost (for the claim's `status.cost`).
    pub cost: i64,
    /// The host cluster (`clusterRef.cluster` of the provider).
    pub host_cluster: String,
    /// Namespace of the VM and Secret on the host cluster.
    pub vm_namespace: String,
    /// Name of the VM, and of the tenant Node.
    pub vm_name: String,
    /// `kubevirt://<vm>`.
    pub provider_id: String,
    /// The Secret `<vm>-userdata` with the user data under key `userdata` (`data`, as
    /// written to the API server). Create it before the VM.
    pub secret: Secret,
    /// The complete `kubevirt.io/v1` VirtualMachine.
    pub vm: Value,
    /// The user data (the Secret's content), as text.
    pub user_data: String,
    /// Node labels: `join` ones are in the join configuration, `after_join` ones must be
    /// set on the Node by autonodes once it has joined.
    pub labels: NodeLabels,
    /// Node taints: the ones kept and the startup taints (the join configuration holds both
    /// plus the registration taint).
    pub taints: NodeTaints,
}

impl std::fmt::Debug for RenderedNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RenderedNode")
            .field("node_type", &self.node_type)
            .field("cost", &self.cost)
            .field("host_cluster", &self.host_cluster)
            .field("vm_namespace", &self.vm_namespace)
            .field("vm_name", &self.vm_name)
            .field("provider_id", &self.provider_id)
            .field("secret", &self.secret.metadata.name)
            .field("user_data", &format!("<{} bytes>", self.user_data.len()))
            .field("labels", &self.labels)
            .field("taints", &self.taints)
            .finish_non_exhaustive()
    }
}

/// Why a claim cannot be planned or rendered. Every message names the claim (and the
/// field or node type at fault).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RenderError {
    /// The claim lacks a field autonodes needs.
    #[error("NodeClaim {claim}: {field} is not set")]
    MissingField {
        /// The claim, `namespace/name`.
        claim: String,
        /// The missing field.
        field: &'static str,
    },
    /// A requirement or the desired capacity is malformed.
    #[error("NodeClaim {claim}: {source}")]
    Request {
        /// The claim.
        claim: String,
        /// What is wrong.
        source: RequestError,
    },
    /// No node type fits, or none has capacity.
    #[error("NodeClaim {claim}: {source}")]
    NoFit {
        /// The claim.
        claim: String,
        /// Reason and message for the `Scheduled=False` condition.
        source: NoFit,
    },
    /// The node type to render cannot be used.
    #[error("NodeClaim {claim}: {source}")]
    TypeUnusable {
        /// The claim.
        claim: String,
        /// The type's problem.
        source: TypeProblem,
    },
    /// A label of the claim or its pool is invalid.
    #[error("NodeClaim {claim}: {source}")]
    Labels {
        /// The claim.
        claim: String,
        /// The invalid label.
        source: LabelError,
    },
    /// A taint of the claim or its pool is invalid.
    #[error("NodeClaim {claim}: {source}")]
    Taints {
        /// The claim.
        claim: String,
        /// The invalid taint.
        source: TaintError,
    },
    /// The VirtualMachine cannot be composed.
    #[error("NodeClaim {claim}: {source}")]
    Template {
        /// The claim.
        claim: String,
        /// What is wrong (naming the node type).
        source: TemplateError,
    },
    /// The user data cannot be rendered.
    #[error("NodeClaim {claim}: {source}")]
    UserData {
        /// The claim.
        claim: String,
        /// What is wrong.
        source: UserDataError,
    },
}

fn claim_id(claim: &NodeClaim) -> String {
    format!(
        "{}/{}",
        claim
            .metadata
            .namespace
            .as_deref()
            .unwrap_or("<no namespace>"),
        claim.metadata.name.as_deref().unwrap_or("<no name>")
    )
}

/// Chooses the node type for a claim ([`scheduling::choose`]) and renders what it gets
/// ([`render_node`]). `claimed` counts the claims per NodeType ([`crate::catalogue::count_claimed`]);
/// `pool` is the claim's NodePool spec when it has one.
pub fn plan_node(
    catalogue: &Catalogue,
    claim: &NodeClaim,
    pool: Option<&NodePoolSpec>,
    claimed: &BTreeMap<String, i64>,
    vm_name: &str,
    join: &JoinParams,
    installation: &str,
) -> Result<RenderedNode, RenderError> {
    let id = || claim_id(claim);
    let request = ClaimRequest::new(&claim.spec, pool).map_err(|source| RenderError::Request {
        claim: id(),
        source,
    })?;
    let chosen =
        scheduling::choose(catalogue, &request, claimed).map_err(|source| RenderError::NoFit {
            claim: id(),
            source,
        })?;
    render_node(chosen, claim, pool, vm_name, join, installation)
}

/// Where the claim's VM runs on the host: its launcher pod labelled with its tenant and
/// pool, the type's placement presets for that group, and the host node affinity of the
/// claim's zone.
/// The claim's static address (`status.address`) and the pool of its type it comes from;
/// none when the type hands out no addresses or the address is not of its pool (the pool
/// changed: the claim has drifted, and its VM keeps the network data it has).
fn static_address<'t>(
    t: &'t PreparedType,
    claim: &NodeClaim,
) -> Option<(
    &'t crate::address_pool::PreparedAddressPool,
    std::net::IpAddr,
)> {
    let pool = t.address_pool.as_ref()?;
    let ip = claim
        .status
        .as_ref()?
        .address
        .as_deref()
        .and_then(crate::address_pool::parse_address)?;
    pool.contains(ip).then_some((pool, ip))
}

fn place_vm(
    vm: &mut Value,
    t: &PreparedType,
    claim: &NodeClaim,
    properties: &autonodes_api::Properties,
) -> Result<(), TemplateError> {
    use template::placement;
    let vcluster = claim.spec.v_cluster_ref.name.as_str();
    placement::label_launcher_pod(vm, vcluster, placement::claim_pool(claim), &t.name)?;
    let presets = placement::parse_placement(&t.properties)
        .map_err(|(property, message)| TemplateError::property(&t.name, property, message))?;
    if !presets.is_empty() {
        let group = placement::claim_group(presets.scope, claim);
        placement::apply_placement(vm, &presets, &group, &t.name)?;
    }
    // A node in one zone runs on host nodes of that zone.
    if let Some(zone) = properties
        .get(crate::properties::PROP_ZONE)
        .filter(|z| !z.is_empty() && crate::node_config::is_valid_label_value(z))
    {
        placement::require_host_zone(vm, zone, &t.name)?;
    }
    Ok(())
}

/// Renders the Secret and VirtualMachine of a claim for a given node type: node
/// properties and labels, taints, the user data (template chosen by property
/// `autonodes.io/user-data-template`), and the VM (forced fields for `vm_name` in the type's
/// VM namespace). The claim needs `metadata.name`, `metadata.namespace` and `metadata.uid`.
pub fn render_node(
    t: &PreparedType,
    claim: &NodeClaim,
    pool: Option<&NodePoolSpec>,
    vm_name: &str,
    join: &JoinParams,
    installation: &str,
) -> Result<RenderedNode, RenderError> {
    let id = || claim_id(claim);
    let missing = |field| RenderError::MissingField { claim: id(), field };
    let name = claim
        .metadata
        .name
        .as_deref()
        .ok_or_else(|| missing("metadata.name"))?;
    let namespace = claim
        .metadata
        .namespace
        .as_deref()
        .ok_or_else(|| missing("metadata.namespace"))?;
    let uid = claim
        .metadata
        .uid
        .as_deref()
        .ok_or_else(|| missing("metadata.uid"))?;
    if let Some(problem) = &t.problem {
        return Err(RenderError::TypeUnusable {
            claim: id(),
            source: problem.clone(),
        });
    }

    let properties = crate::node_config::claim_node_properties(t, pool, claim);
    let identity = crate::template::names::node_identity_labels(name, namespace, uid, installation);
    let labels = crate::node_config::node_labels(
        &properties,
        pool.map(|p| &p.labels),
        &claim.spec.labels,
        &identity,
    )
    .map_err(|source| RenderError::Labels {
        claim: id(),
        source,
    })?;
    let taints = crate::node_config::node_taints(t, pool, &claim.spec).map_err(|source| {
        RenderError::Taints {
            claim: id(),
            source,
        }
    })?;
    let user_data_error = |source| RenderError::UserData {
        claim: id(),
        source,
    };
    let template =
        JoinTemplate::from_property(properties.get(PROP_USER_DATA_TEMPLATE).map(String::as_str))
            .map_err(user_data_error)?;
    let ssh_keys = crate::properties::config_property(&properties, PROP_SSH_KEYS)
        .map(|v| userdata::parse_ssh_keys(v))
        .unwrap_or_default();
    let registration_taints = taints.registration();
    let kubelet_args = crate::node_config::kubelet_args(pool, &claim.spec);
    let user_data = userdata::render_user_data(&UserDataInput {
        template,
        node_name: vm_name,
        join,
        node_labels: &labels.join,
        taints: &registration_taints,
        kubelet_args: &kubelet_args,
        user_cloud_config: crate::properties::config_property(&properties, PROP_USER_DATA)
            .map(String::as_str),
        ssh_keys: &ssh_keys,
        image_prepared: properties
            .get(PROP_IMAGE_PREPARED)
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("true")),
        download_url: properties
            .get(PROP_KUBERNETES_DOWNLOAD_URL)
            .map(String::as_str),
    })
    .map_err(user_data_error)?;

    let managed = crate::template::names::managed_labels(name, namespace, uid, installation);
    let mut vm = template::finalize_vm(
        &t.template,
        &VmIdentity {
            name: vm_name,
            namespace: &t.vm_namespace,
            labels: &managed,
        },
        &t.name,
    )
    .map_err(|source| RenderError::Template {
        claim: id(),
        source,
    })?;
    place_vm(&mut vm, t, claim, &properties).map_err(|source| RenderError::Template {
        claim: id(),
        source,
    })?;
    let mut data = BTreeMap::from([(
        USER_DATA_KEY.to_string(),
        ByteString(user_data.clone().into_bytes()),
    )]);
    if let Some((pool, ip)) = static_address(t, claim) {
        let mac = crate::address_pool::mac_for(ip);
        template::use_network_data(&mut vm, vm_name, &mac, &t.name).map_err(|source| {
            RenderError::Template {
                claim: id(),
                source,
            }
        })?;
        data.insert(
            NETWORK_DATA_KEY.to_string(),
            ByteString(pool.network_data(ip).into_bytes()),
        );
    }

    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(crate::template::names::user_data_secret_name(vm_name)),
            namespace: Some(t.vm_namespace.clone()),
            labels: Some(managed),
            ..ObjectMeta::default()
        },
        type_: Some("Opaque".to_string()),
        data: Some(data),
        ..Secret::default()
    };

    Ok(RenderedNode {
        node_type: t.name.clone(),
        cost: t.cost,
        host_cluster: t.host_cluster.clone(),
        vm_namespace: t.vm_namespace.clone(),
        vm_name: vm_name.to_string(),
        provider_id: userdata::provider_id(vm_name),
        secret,
        vm,
        user_data,
        labels,
        taints,
    })
}
