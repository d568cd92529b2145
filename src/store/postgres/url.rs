//! A PostgreSQL connection string read as libpq reads it: TLS (`sslmode`,
//! `sslrootcert`, `sslcert`, `sslkey`, which the driver does not take) and the
//! defaults of the keepalives and timeouts.

use std::time::Duration;

use super::PgTls;
use crate::error::{Error, Result};

/// The hosts and ports of a configuration, for an error message.
pub(super) fn pg_hosts(pg: &postgres::Config) -> String {
    let ports = pg.get_ports();
    let hosts: Vec<String> = pg
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
            match h {
                postgres::config::Host::Tcp(h) => format!("{h}:{port}"),
                #[cfg(unix)]
                postgres::config::Host::Unix(p) => format!("{}:{port}", p.display()),
            }
        })
        .collect();
    if hosts.is_empty() {
        "localhost:5432".into()
    } else {
        hosts.join(", ")
    }
}

/// The connection string's options that txbox reads itself: the driver
/// (`tokio-postgres`) takes only `sslmode` disable, prefer and require.
const TLS_OPTIONS: [&str; 4] = ["sslmode", "sslrootcert", "sslcert", "sslkey"];

/// The `postgres` configuration and the TLS connector of a connection string,
/// with its TLS options read as libpq reads them:
///
/// | `sslmode` | encrypted | the certificate |
/// |---|---|---|
/// | `disable` | no | - |
/// | `prefer` (default) | when the server offers TLS | not checked (checked against `sslrootcert` when given) |
/// | `require` | yes, or the connection fails | not checked (checked against `sslrootcert` when given) |
/// | `verify-ca` | yes | signed by a CA of `sslrootcert` (required) |
/// | `verify-full` | yes | signed by a CA of `sslrootcert` (or the system's), and issued for the host connected to |
///
/// `sslrootcert` is a PEM file of the CAs to trust instead of the system's, or
/// `system` for the system's (then `sslmode` defaults to `verify-full`);
/// `sslcert` and `sslkey` a client certificate and its PKCS #8 key, in PEM. The
/// keepalives and timeouts get defaults unless the string sets them
/// (`keepalives_idle` 5 s, `keepalives_interval` 1 s, `keepalives_retries` 5,
/// `tcp_user_timeout` 10 s, `connect_timeout` 10 s): a connection whose link
/// drops everything is given up within 10 s, idle or in a call.
///
/// For a pool of your own with txbox's TLS:
///
/// ```no_run
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let url = "postgres://app@db.internal/shop?sslmode=verify-full&sslrootcert=/etc/ssl/db-ca.pem";
/// let (pg, tls) = txbox::pg_config(url)?;
/// let pool = r2d2::Pool::builder()
///     .max_size(32)
///     .build(r2d2_postgres::PostgresConnectionManager::new(pg, tls))?;
/// let store = txbox::PgStore::from_pool(pool, &txbox::Config::builder().build()?)?;
/// # let _ = store; Ok(()) }
/// ```
pub fn pg_config(url: &str) -> Result<(postgres::Config, PgTls)> {
    let invalid = |e: &dyn std::fmt::Display| Error::config("database url", e.to_string());
    let (rest, options) = split_tls_options(url).map_err(|e| invalid(&e))?;
    let mut pg: postgres::Config = rest.parse().map_err(|e| invalid(&e))?;
    let get = |key: &str| {
        options
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    };
    let roots = get("sslrootcert");
    let system_roots = roots == Some("system");
    let given_roots = roots.filter(|r| !system_roots && !r.is_empty());
    use crate::tls::Verify;
    use postgres::config::SslMode;
    let (mode, verify) = match get("sslmode").unwrap_or(if system_roots { "verify-full" } else { "prefer" }) {
        "disable" => (SslMode::Disable, Verify::Nothing),
        m @ ("prefer" | "require") => {
            let mode = if m == "prefer" { SslMode::Prefer } else { SslMode::Require };
            (mode, if given_roots.is_some() { Verify::Chain } else { Verify::Nothing })
        }
        // the chain without the name is only as good as the roots: the
        // system's would let any public certificate through (libpq, too,
        // wants a file)
        "verify-ca" if given_roots.is_none() => {
            return Err(invalid(&"sslmode=verify-ca takes sslrootcert, a file of the CAs to trust"))
        }
        "verify-ca" => (SslMode::Require, Verify::Chain),
        "verify-full" => (SslMode::Require, Verify::Full),
        other => {
            return Err(invalid(&format!(
                "sslmode {other:?} is not supported: use disable, prefer, require, verify-ca or verify-full"
            )))
        }
    };
    if system_roots && verify != Verify::Full && mode != SslMode::Disable {
        return Err(invalid(
            &"sslrootcert=system takes sslmode verify-full (as libpq)",
        ));
    }
    pg.ssl_mode(mode);
    let mut tls = crate::tls::TlsOptions::new(verify);
    tls.roots = given_roots.map(Into::into);
    match (get("sslcert"), get("sslkey")) {
        (Some(c), Some(k)) => tls.identity = Some((c.into(), k.into())),
        (None, None) => {}
        _ => return Err(invalid(&"sslcert and sslkey go together")),
    }
    // a connection dropped without a word (a failover, a NAT's idle timeout,
    // a partition) is found within 10 s, not two hours: the commit listener
    // sends nothing, and would wait on such a connection for good
    if pg.get_keepalives_idle() == Duration::from_secs(2 * 60 * 60) {
        pg.keepalives_idle(Duration::from_secs(5));
    }
    // and then given up after 5 unanswered probes 1 s apart (the OS
    // defaults, 9 probes 75 s apart, took 12 minutes): 10 s in all
    if pg.get_keepalives_interval().is_none() {
        pg.keepalives_interval(Duration::from_secs(1));
    }
    if pg.get_keepalives_retries().is_none() {
        pg.keepalives_retries(5);
    }
    // data sent and never acknowledged (a black-holed connection in a
    // claim) fails the connection after as long, not after 15 minutes of
    // retransmissions (a long query is not cut: its request was acknowledged)
    if pg.get_tcp_user_timeout().is_none() {
        pg.tcp_user_timeout(Duration::from_secs(10));
    }
    // a host that never answers the connect is given up after 10 s
    if pg.get_connect_timeout().is_none() {
        pg.connect_timeout(Duration::from_secs(10));
    }
    Ok((
        pg,
        postgres_native_tls::MakeTlsConnector::new(tls.connector()?),
    ))
}

/// The connection string without [`TLS_OPTIONS`], and those options (decoded).
fn split_tls_options(url: &str) -> std::result::Result<(String, Vec<(String, String)>), String> {
    let mut ours = Vec::new();
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        // the query starts after the credentials: a password may hold a `?`
        let from = url.rfind('@').map_or(0, |at| at + 1);
        let Some(q) = url[from..].find('?').map(|i| from + i) else {
            return Ok((url.to_owned(), ours));
        };
        let (base, query) = (&url[..q], &url[q + 1..]);
        let decode = |s: &str| {
            percent_encoding::percent_decode_str(s)
                .decode_utf8()
                .map(|d| d.into_owned())
                .map_err(|e| format!("{s:?}: {e}"))
        };
        let mut kept = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let key = decode(k)?;
            if TLS_OPTIONS.contains(&key.as_str()) {
                ours.push((key, decode(v)?));
            } else {
                kept.push(pair);
            }
        }
        let rest = match kept.is_empty() {
            true => base.to_owned(),
            false => format!("{base}?{}", kept.join("&")),
        };
        return Ok((rest, ours));
    }
    // key = value pairs; a value may be quoted ('...', with \' and \\)
    let mut rest = String::new();
    let mut chars = url.char_indices().peekable();
    let mut last = 0;
    loop {
        while chars.next_if(|(_, c)| c.is_whitespace()).is_some() {}
        let Some(&(start, _)) = chars.peek() else {
            break;
        };
        let mut key = String::new();
        while let Some((_, c)) = chars.next_if(|(_, c)| *c != '=' && !c.is_whitespace()) {
            key.push(c);
        }
        while chars.next_if(|(_, c)| c.is_whitespace()).is_some() {}
        if chars.next_if(|(_, c)| *c == '=').is_none() {
            return Err(format!("{key:?} has no value"));
        }
        while chars.next_if(|(_, c)| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        let quoted = chars.next_if(|(_, c)| *c == '\'').is_some();
        loop {
            match chars.next() {
                None if quoted => return Err(format!("the value of {key:?} is not closed")),
                None => break,
                Some((_, '\'')) if quoted => break,
                Some((_, c)) if c.is_whitespace() && !quoted => break,
                Some((_, '\\')) => match chars.next() {
                    Some((_, c)) => value.push(c),
                    None => return Err(format!("the value of {key:?} ends in a backslash")),
                },
                Some((_, c)) => value.push(c),
            }
        }
        let end = chars.peek().map_or(url.len(), |(i, _)| *i);
        if TLS_OPTIONS.contains(&key.as_str()) {
            rest.push_str(&url[last..start]);
            last = end;
            ours.push((key, value));
        }
    }
    rest.push_str(&url[last..]);
    Ok((rest, ours))
}
#[cfg(test)]
mod tls_option_tests {
    use super::{pg_config, split_tls_options};
    use std::time::Duration;

    /// The timeouts' defaults, and a URL's own values kept.
    #[test]
    fn the_timeouts_have_defaults_and_the_url_wins() {
        let (pg, _) = pg_config("postgres://u@db/x").unwrap();
        assert_eq!(pg.get_connect_timeout(), Some(&Duration::from_secs(10)));
        assert_eq!(pg.get_keepalives_idle(), Duration::from_secs(5));
        assert_eq!(pg.get_keepalives_interval(), Some(Duration::from_secs(1)));
        assert_eq!(pg.get_keepalives_retries(), Some(5));
        assert_eq!(pg.get_tcp_user_timeout(), Some(&Duration::from_secs(10)));
        let (pg, _) = pg_config(
            "postgres://u@db/x?connect_timeout=3&keepalives_idle=7&keepalives_interval=2&keepalives_retries=9&tcp_user_timeout=11",
        )
        .unwrap();
        assert_eq!(pg.get_connect_timeout(), Some(&Duration::from_secs(3)));
        assert_eq!(pg.get_keepalives_idle(), Duration::from_secs(7));
        assert_eq!(pg.get_keepalives_interval(), Some(Duration::from_secs(2)));
        assert_eq!(pg.get_keepalives_retries(), Some(9));
        assert_eq!(pg.get_tcp_user_timeout(), Some(&Duration::from_secs(11)));
    }

    fn split(url: &str) -> (String, Vec<(String, String)>) {
        split_tls_options(url).unwrap_or_else(|e| panic!("{url}: {e}"))
    }

    /// What the driver refuses is taken out and decoded; the rest is left as it was.
    #[test]
    fn the_tls_options_are_taken_out_of_both_forms() {
        let (rest, ours) = split(
            "postgres://u:p%40ss@db:5432/shop?application_name=a&sslmode=verify-full&sslrootcert=%2Fetc%2Fca%20x.pem",
        );
        assert_eq!(rest, "postgres://u:p%40ss@db:5432/shop?application_name=a");
        assert_eq!(
            ours,
            [
                ("sslmode".into(), "verify-full".into()),
                ("sslrootcert".into(), "/etc/ca x.pem".into())
            ]
        );
        let (rest, ours) = split("postgresql://db/shop?sslmode=require");
        assert_eq!((rest.as_str(), ours.len()), ("postgresql://db/shop", 1));
        let (rest, ours) =
            split("host=db  sslmode = verify-ca sslrootcert='/a b/it\\'s.pem' user=u");
        assert_eq!(
            rest.split_whitespace().collect::<Vec<_>>(),
            ["host=db", "user=u"]
        );
        assert_eq!(
            ours,
            [
                ("sslmode".into(), "verify-ca".into()),
                ("sslrootcert".into(), "/a b/it's.pem".into())
            ]
        );
        assert!(split_tls_options("host=db sslrootcert='open").is_err());
        assert!(split_tls_options("host").is_err());
    }
}
