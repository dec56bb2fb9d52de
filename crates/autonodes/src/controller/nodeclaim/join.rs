//! What a claim's node joins with, shared by the launch of a new VM and the binding of a
//! warm one: the tenant's join parameters, and the condition reason of a render error.

use std::time::Duration;

use kube::runtime::controller::Action;

use super::provisioning::{Provisioning, Step};
use super::status::PROVISIONED;
use super::tokens::ensure_token;
use crate::controller::error::Error;
use crate::remote::api::{HostApi, TenantApi};
use autonodes_api::reasons::ClaimReason;
use autonodes_core::join::JoinInfo;
use autonodes_core::render::RenderError;
use autonodes_core::userdata::{self, BootstrapToken, JoinParams, UserDataError};

use crate::remote::clients::Remote;

/// The claim's join: its bootstrap token (minted if need be; `true` when minted now) and
/// the tenant's join parameters. `Err(step)` when the tenant cannot be joined yet (the
/// reason is on `Provisioned`).
pub(super) async fn claim_join<H: HostApi, T: TenantApi>(
    p: &mut Provisioning<'_, H, T>,
) -> Result<Result<(JoinParams, bool), Step>, Error> {
    let token = ensure_token(p.claim, p.ctx.config, p.tenant()).await?;
    let info = p.tenant().join_info().await?;
    let download_url = p.ctx.config.kubernetes_download_url.clone();
    match join_params(p.tenant().remote(), &token.token, info, download_url) {
        Ok(j) => Ok(Ok((j, token.fresh))),
        Err((reason, message)) => {
            p.status.set(PROVISIONED, false, reason, message);
            Ok(Err(Step::Stop(Action::requeue(Duration::from_secs(30)))))
        }
    }
}

/// Join parameters for the tenant: the endpoint it publishes (else its kubeconfig's
/// server), the token, its CA and the CA's hash, its version.
fn join_params(
    tenant: &Remote,
    token: &BootstrapToken,
    info: JoinInfo,
    download_url: String,
) -> Result<JoinParams, (ClaimReason, String)> {
    let kubernetes_version = info
        .version
        .map_err(|why| (ClaimReason::UnsupportedTenantVersion, why))?;
    if !kubernetes_version.is_joinable() {
        return Err((
            ClaimReason::UnsupportedTenantVersion,
            format!(
                "the {} runs Kubernetes {kubernetes_version}; nodes join {} or newer",
                tenant.key,
                autonodes_core::kubeversion::OLDEST_JOINABLE
            ),
        ));
    }
    let published = info.published;
    let ca = tenant.ca_pem.as_deref().ok_or((
        ClaimReason::TenantCANotFound,
        format!(
            "the kubeconfig of the {} has no certificate-authority-data, so nodes cannot verify it",
            tenant.key
        ),
    ))?;
    let hash = userdata::ca_cert_hash(ca).map_err(|e| {
        (
            ClaimReason::InvalidTenantCA,
            format!("the CA of the {}: {e}", tenant.key),
        )
    })?;
    let endpoint = match published.endpoint {
        Some(e) => e,
        None => tenant.endpoint().map_err(|e| {
            (
                ClaimReason::InvalidKubeconfig,
                format!("the kubeconfig of the {}: {e}", tenant.key),
            )
        })?,
    };
    Ok(JoinParams {
        api_server_endpoint: endpoint,
        token: token.token(),
        ca_cert_hashes: vec![hash],
        join_script_url: published.join_script_url,
        ca_pem: Some(String::from_utf8_lossy(ca).into_owned()),
        kubernetes_version,
        download_url,
    })
}

/// The condition reason for a render error.
pub(super) fn render_reason(e: &RenderError) -> ClaimReason {
    match e {
        RenderError::UserData {
            source: UserDataError::TooLarge { .. },
            ..
        } => ClaimReason::UserDataTooLarge,
        RenderError::UserData {
            source: UserDataError::KubeletArg(_),
            ..
        } => ClaimReason::InvalidKubeletArgs,
        RenderError::UserData { .. } => ClaimReason::InvalidUserData,
        RenderError::Labels { .. } => ClaimReason::InvalidLabels,
        RenderError::Taints { .. } => ClaimReason::InvalidTaints,
        RenderError::Template { .. } => ClaimReason::InvalidTemplate,
        RenderError::TypeUnusable { .. } => ClaimReason::NodeTypeUnavailable,
        RenderError::Request { .. } => ClaimReason::InvalidRequest,
        RenderError::NoFit { source, .. } => super::schedule::nofit_reason(source.reason),
        RenderError::MissingField { .. } => ClaimReason::InvalidClaim,
    }
}
