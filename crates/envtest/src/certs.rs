//! The control plane's certificates: a CA, the API server's serving certificate, an admin
//! client certificate (`system:masters`) and the ServiceAccount signing key. ECDSA P-256, as
//! rcgen makes them by default.

use std::path::Path;

use base64::Engine;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use crate::{Error, io_err};

pub(crate) struct Pki {
    pub ca_pem: String,
    pub serving_cert_pem: String,
    pub serving_key_pem: String,
    pub admin_cert_pem: String,
    pub admin_key_pem: String,
    pub sa_key_pem: String,
    pub sa_pub_pem: String,
    ca_key_pem: String,
}

pub(crate) fn base64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn ca_params() -> Result<CertificateParams, Error> {
    let mut p = CertificateParams::new(Vec::<String>::new())?;
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name.push(DnType::CommonName, "envtest-ca");
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::CrlSign,
    ];
    Ok(p)
}

fn leaf(
    names: &[&str],
    cn: &str,
    org: Option<&str>,
    usage: ExtendedKeyUsagePurpose,
    issuer: &Issuer<'_, KeyPair>,
) -> Result<(String, String), Error> {
    let key = KeyPair::generate()?;
    let mut p = CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())?;
    p.distinguished_name.push(DnType::CommonName, cn);
    if let Some(org) = org {
        p.distinguished_name.push(DnType::OrganizationName, org);
    }
    p.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    p.extended_key_usages = vec![usage];
    let cert = p.signed_by(&key, issuer)?;
    Ok((cert.pem(), key.serialize_pem()))
}

impl Pki {
    /// `api_ips`: addresses the API server serves on besides loopback and the `kubernetes`
    /// Service's ClusterIP.
    pub fn generate(api_ips: &[String]) -> Result<Pki, Error> {
        let ca_key = KeyPair::generate()?;
        let params = ca_params()?;
        let ca_cert = params.self_signed(&ca_key)?;
        let ca_key_pem = ca_key.serialize_pem();
        let issuer = Issuer::new(params, ca_key);
        let mut names = vec![
            "127.0.0.1",
            "localhost",
            "10.96.0.1",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ];
        for ip in api_ips {
            if !names.contains(&ip.as_str()) {
                names.push(ip);
            }
        }
        let (serving_cert_pem, serving_key_pem) = leaf(
            &names,
            "kube-apiserver",
            None,
            ExtendedKeyUsagePurpose::ServerAuth,
            &issuer,
        )?;
        let (admin_cert_pem, admin_key_pem) = leaf(
            &[],
            "envtest-admin",
            Some("system:masters"),
            ExtendedKeyUsagePurpose::ClientAuth,
            &issuer,
        )?;
        let sa_key = KeyPair::generate()?;
        let sa_key_pem = sa_key.serialize_pem();
        let sa_pub_pem = sa_key.public_key_pem();
        Ok(Pki {
            ca_pem: ca_cert.pem(),
            serving_cert_pem,
            serving_key_pem,
            admin_cert_pem,
            admin_key_pem,
            sa_key_pem,
            sa_pub_pem,
            ca_key_pem,
        })
    }

    pub fn write_ca_key(&self, dir: &Path) -> Result<(), Error> {
        let p = dir.join("ca.key");
        std::fs::write(&p, &self.ca_key_pem).map_err(io_err(format!("writing {}", p.display())))
    }
}

/// A serving certificate for `names` signed by the CA whose files are in `dir`.
pub(crate) fn serving_cert_from_ca_pem(
    dir: &Path,
    names: &[&str],
) -> Result<(String, String), Error> {
    let read = |name: &str| {
        let p = dir.join(name);
        std::fs::read_to_string(&p).map_err(io_err(format!("reading {}", p.display())))
    };
    let key = KeyPair::from_pem(&read("ca.key")?)?;
    // The CA's subject and key identifier follow from its parameters and key, so the issuer
    // is rebuilt from them rather than parsed from ca.crt.
    let issuer = Issuer::new(ca_params()?, key);
    leaf(
        names,
        names.first().copied().unwrap_or("webhook"),
        None,
        ExtendedKeyUsagePurpose::ServerAuth,
        &issuer,
    )
}
