//! TLS: the one stack of every connection txbox opens (`native-tls`: OpenSSL on
//! Linux, the platform's own elsewhere), and what each service's options ask of it.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// How much of the server's certificate is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verify {
    /// Encrypted, the certificate unchecked (PostgreSQL's `require` without a
    /// root certificate, RabbitMQ's `verify_none`).
    Nothing,
    /// Signed by a trusted CA, for any host name (`verify-ca`).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    Chain,
    /// Signed by a trusted CA and issued for the host connected to (`verify-full`).
    Full,
}

/// What a TLS connection trusts and presents.
#[derive(Debug, Clone)]
pub(crate) struct TlsOptions {
    pub(crate) verify: Verify,
    /// CA certificates (PEM) trusted instead of the system's; `None`: the system's.
    pub(crate) roots: Option<PathBuf>,
    /// A client certificate and its key (PEM, PKCS #8), when the server asks for one.
    pub(crate) identity: Option<(PathBuf, PathBuf)>,
}

fn read(what: &str, path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|source| Error::Io {
        context: format!("reading the TLS {what} {}", path.display()),
        source,
    })
}

impl TlsOptions {
    pub(crate) fn new(verify: Verify) -> Self {
        TlsOptions {
            verify,
            roots: None,
            identity: None,
        }
    }

    /// The connector: a roots file that cannot be read or holds no certificate
    /// is an error naming the file, before anything connects.
    pub(crate) fn connector(&self) -> Result<native_tls::TlsConnector> {
        let bad = |what: &str, path: &Path, e: native_tls::Error| Error::Config {
            path: format!("TLS {what} {}", path.display()),
            message: format!("is not usable: {e}"),
        };
        let mut b = native_tls::TlsConnector::builder();
        match self.verify {
            Verify::Nothing => {
                b.danger_accept_invalid_certs(true);
                b.danger_accept_invalid_hostnames(true);
            }
            Verify::Chain => {
                b.danger_accept_invalid_hostnames(true);
            }
            Verify::Full => {}
        }
        if let Some(path) = &self.roots {
            let certs = native_tls::Certificate::stack_from_pem(&read("root certificates", path)?)
                .map_err(|e| bad("root certificates", path, e))?;
            if certs.is_empty() {
                return Err(Error::Config {
                    path: format!("TLS root certificates {}", path.display()),
                    message: "holds no PEM certificate".into(),
                });
            }
            // only these, as libpq and the RabbitMQ clients read a CA file
            b.disable_built_in_roots(true);
            for c in certs {
                b.add_root_certificate(c);
            }
        }
        if let Some((cert, key)) = &self.identity {
            let id = native_tls::Identity::from_pkcs8(
                &read("client certificate", cert)?,
                &read("client key", key)?,
            )
            .map_err(|e| bad("client certificate", cert, e))?;
            b.identity(id);
        }
        b.build().map_err(|e| Error::Config {
            path: "TLS".into(),
            message: format!("cannot set up a TLS connector: {e}"),
        })
    }
}
