//! The operator's deployment files, generated from its code as controller-gen generates a
//! Kubebuilder project's: the `config/` tree ([`manifests`]), the Helm chart ([`helm`]) and
//! the OLM bundle ([`olm`]). A build tool: nothing here ships in the operator's binary.

pub mod helm;
pub mod manifests;
pub mod monitoring;
pub mod olm;
