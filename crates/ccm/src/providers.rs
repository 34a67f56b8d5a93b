//! The providers compiled into the `ccm` and `ccm-controller-manager` binaries: one
//! registry, so both run the same clouds with the same `--cloud-provider` names.

/// Providers compiled into this binary. Provider crates register here, one line each.
pub fn providers() -> ccm_cloud::ProviderRegistry {
    let mut registry = ccm_cloud::ProviderRegistry::new();
    // Invariant: each name is registered once, so registering cannot collide.
    ccm_provider_sim::register(&mut registry).expect("fresh registry");
    #[cfg(feature = "aws")]
    ccm_provider_aws::register(&mut registry).expect("fresh registry");
    ccm_provider_metal::register(&mut registry).expect("fresh registry");
    #[cfg(feature = "openstack")]
    ccm_provider_openstack::register(&mut registry).expect("fresh registry");
    registry
}
