//! `spec.podSecurityContext` and `spec.containerSecurityContext` held to the `restricted`
//! Pod Security Standard (Kubernetes' "Pod Security Standards", the policy the API server's
//! PodSecurity admission enforces, at the versions we support): the operator's own
//! settings meet it, and an override may change them only within it. Each refusal names
//! the field that breaks it. The real API server's PodSecurity admission is the oracle
//! these rules are tested against (`tests/admission_children.rs`).

use k8s_openapi::api::core::v1::{
    AppArmorProfile, Capabilities, PodSecurityContext, SELinuxOptions, SeccompProfile,
    SecurityContext, WindowsSecurityContextOptions,
};

use crate::field_error::FieldError;

/// The only capability a container may add under `restricted`.
pub const ADDABLE_CAPABILITY: &str = "NET_BIND_SERVICE";

/// SELinux types a pod may ask for under `baseline` (and so `restricted`).
pub const SELINUX_TYPES: [&str; 4] = [
    "container_t",
    "container_init_t",
    "container_kvm_t",
    "container_engine_t",
];

/// Sysctls `baseline` (and so `restricted`) allows: the kernel's namespaced, safe set.
pub const SAFE_SYSCTLS: [&str; 10] = [
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
];

const WHY: &str = "the pods must meet the restricted Pod Security Standard";

/// The pod-level override's breaches of `restricted`, named under `field`
/// (`spec.podSecurityContext`).
pub fn check_pod(field: &str, context: &PodSecurityContext) -> Vec<FieldError> {
    let mut errors = shared(
        field,
        Shared {
            run_as_non_root: context.run_as_non_root,
            run_as_user: context.run_as_user,
            seccomp: context.seccomp_profile.as_ref(),
            app_armor: context.app_armor_profile.as_ref(),
            se_linux: context.se_linux_options.as_ref(),
            windows: context.windows_options.as_ref(),
        },
    );
    for (i, sysctl) in context.sysctls.iter().flatten().enumerate() {
        if !SAFE_SYSCTLS.contains(&sysctl.name.as_str()) {
            errors.push(FieldError::not_supported(
                format!("{field}.sysctls[{i}].name"),
                &sysctl.name,
                &SAFE_SYSCTLS,
            ));
        }
    }
    errors
}

/// The container-level override's breaches of `restricted`, named under `field`
/// (`spec.containerSecurityContext`).
pub fn check_container(field: &str, context: &SecurityContext) -> Vec<FieldError> {
    let mut errors = Vec::new();
    if context.privileged == Some(true) {
        errors.push(FieldError::invalid(
            format!("{field}.privileged"),
            true,
            format!("{WHY}: no privileged containers"),
        ));
    }
    if context.allow_privilege_escalation == Some(true) {
        errors.push(FieldError::invalid(
            format!("{field}.allowPrivilegeEscalation"),
            true,
            format!("{WHY}: must be false"),
        ));
    }
    if let Some(Capabilities { add, drop }) = &context.capabilities {
        if !drop.iter().flatten().any(|c| c == "ALL") {
            errors.push(FieldError::invalid(
                format!("{field}.capabilities.drop"),
                drop.clone().unwrap_or_default(),
                format!(
                    "{WHY}: must include \"ALL\" (capabilities replaces the operator's whole setting, which drops ALL)"
                ),
            ));
        }
        for (i, cap) in add.iter().flatten().enumerate() {
            if cap != ADDABLE_CAPABILITY {
                errors.push(FieldError::invalid(
                    format!("{field}.capabilities.add[{i}]"),
                    cap,
                    format!("{WHY}: only {ADDABLE_CAPABILITY} may be added"),
                ));
            }
        }
    }
    if context
        .proc_mount
        .as_deref()
        .is_some_and(|m| m != "Default")
    {
        errors.push(FieldError::not_supported(
            format!("{field}.procMount"),
            context.proc_mount.as_deref().unwrap_or_default(),
            &["Default"],
        ));
    }
    errors.extend(shared(
        field,
        Shared {
            run_as_non_root: context.run_as_non_root,
            run_as_user: context.run_as_user,
            seccomp: context.seccomp_profile.as_ref(),
            app_armor: context.app_armor_profile.as_ref(),
            se_linux: context.se_linux_options.as_ref(),
            windows: context.windows_options.as_ref(),
        },
    ));
    errors
}

/// The fields pod-level and container-level contexts share, under the same rules.
struct Shared<'a> {
    run_as_non_root: Option<bool>,
    run_as_user: Option<i64>,
    seccomp: Option<&'a SeccompProfile>,
    app_armor: Option<&'a AppArmorProfile>,
    se_linux: Option<&'a SELinuxOptions>,
    windows: Option<&'a WindowsSecurityContextOptions>,
}

/// The breaches of `restricted` in the fields both contexts have.
fn shared(field: &str, context: Shared<'_>) -> Vec<FieldError> {
    let mut errors = Vec::new();
    non_root(
        field,
        context.run_as_non_root,
        context.run_as_user,
        &mut errors,
    );
    seccomp(field, context.seccomp, &mut errors);
    app_armor(field, context.app_armor, &mut errors);
    se_linux(field, context.se_linux, &mut errors);
    host_process(field, context.windows, &mut errors);
    errors
}

fn non_root(
    field: &str,
    run_as_non_root: Option<bool>,
    run_as_user: Option<i64>,
    errors: &mut Vec<FieldError>,
) {
    if run_as_non_root == Some(false) {
        errors.push(FieldError::invalid(
            format!("{field}.runAsNonRoot"),
            false,
            format!("{WHY}: must be true"),
        ));
    }
    if run_as_user == Some(0) {
        errors.push(FieldError::invalid(
            format!("{field}.runAsUser"),
            0,
            format!("{WHY}: must not be 0 (root)"),
        ));
    }
}

fn seccomp(field: &str, profile: Option<&SeccompProfile>, errors: &mut Vec<FieldError>) {
    if let Some(profile) = profile
        && !matches!(profile.type_.as_str(), "RuntimeDefault" | "Localhost")
    {
        errors.push(FieldError::not_supported(
            format!("{field}.seccompProfile.type"),
            &profile.type_,
            &["RuntimeDefault", "Localhost"],
        ));
    }
}

fn app_armor(field: &str, profile: Option<&AppArmorProfile>, errors: &mut Vec<FieldError>) {
    if let Some(profile) = profile
        && profile.type_ == "Unconfined"
    {
        errors.push(FieldError::not_supported(
            format!("{field}.appArmorProfile.type"),
            &profile.type_,
            &["RuntimeDefault", "Localhost"],
        ));
    }
}

fn se_linux(field: &str, options: Option<&SELinuxOptions>, errors: &mut Vec<FieldError>) {
    let Some(options) = options else { return };
    if let Some(type_) = options.type_.as_deref()
        && !type_.is_empty()
        && !SELINUX_TYPES.contains(&type_)
    {
        errors.push(FieldError::not_supported(
            format!("{field}.seLinuxOptions.type"),
            type_,
            &SELINUX_TYPES,
        ));
    }
    for (name, value) in [("user", &options.user), ("role", &options.role)] {
        if let Some(value) = value.as_deref().filter(|v| !v.is_empty()) {
            errors.push(FieldError::invalid(
                format!("{field}.seLinuxOptions.{name}"),
                value,
                format!("{WHY}: must be empty"),
            ));
        }
    }
}

fn host_process(
    field: &str,
    options: Option<&WindowsSecurityContextOptions>,
    errors: &mut Vec<FieldError>,
) {
    if options.and_then(|o| o.host_process) == Some(true) {
        errors.push(FieldError::invalid(
            format!("{field}.windowsOptions.hostProcess"),
            true,
            format!("{WHY}: no host processes"),
        ));
    }
}
