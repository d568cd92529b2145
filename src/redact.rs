//! Keeps secrets out of what txbox prints, logs or puts in an error: passwords in
//! URLs (`amqp://user:password@host`, `postgres://...`) and secret client
//! properties (`sasl.password`, `ssl.key.password`, ...).

use std::collections::BTreeMap;
use std::fmt;

/// What stands in for a secret.
pub(crate) const REDACTED: &str = "<redacted>";

/// `text` with the password of every URL in it replaced: `scheme://user:pw@host`
/// becomes `scheme://user:<redacted>@host`. The user info ends at the last `@`
/// before the next whitespace, so a password with a raw `@` or `/` in it is
/// covered too. A `password=...` (a query parameter, a key=value connection
/// string) is redacted up to the next whitespace or `&`.
pub(crate) fn urls(text: &str) -> String {
    password_params(&user_info(text))
}

/// Every `password=value` of `text` (any case) with its value redacted.
fn password_params(text: &str) -> String {
    const KEY: &str = "password=";
    let lower = text.to_ascii_lowercase();
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    while let Some(found) = lower[at..].find(KEY) {
        let value = at + found + KEY.len();
        out.push_str(&text[at..value]);
        out.push_str(REDACTED);
        at = value
            + text[value..]
                .find(|c: char| c.is_whitespace() || c == '&')
                .unwrap_or(text.len() - value);
    }
    out.push_str(&text[at..]);
    out
}

/// The user-info passwords of [`urls`].
fn user_info(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let (head, tail) = rest.split_at(at + 3);
        out.push_str(head);
        let end = tail.find(char::is_whitespace).unwrap_or(tail.len());
        let (token, after) = tail.split_at(end);
        match token.rfind('@') {
            Some(userinfo_end) => {
                let userinfo = &token[..userinfo_end];
                match userinfo.find(':') {
                    Some(colon) => {
                        out.push_str(&userinfo[..=colon]);
                        out.push_str(REDACTED);
                    }
                    None => out.push_str(userinfo),
                }
                out.push_str(&token[userinfo_end..]);
            }
            None => out.push_str(token),
        }
        rest = after;
    }
    out.push_str(rest);
    out
}

/// Whether a client property holds a secret (librdkafka's `sasl.password`,
/// `ssl.key.password`, `ssl.keystore.password`, `ssl.key.pem`,
/// `sasl.oauthbearer.client.secret`, `sasl.oauthbearer.config`, ...).
pub(crate) fn is_secret(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    [
        "password",
        "secret",
        "token",
        "ssl.key.pem",
        "oauthbearer.config",
        "jaas",
    ]
    .iter()
    .any(|s| k.contains(s))
}

/// Client properties for `Debug`: secret values redacted, URLs scrubbed.
#[cfg_attr(not(feature = "kafka"), allow(dead_code))]
pub(crate) struct Properties<'a>(pub(crate) &'a BTreeMap<String, String>);

impl fmt::Debug for Properties<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.0.iter().map(|(k, v)| {
                let v = if is_secret(k) {
                    REDACTED.to_string()
                } else {
                    urls(v)
                };
                (k, v)
            }))
            .finish()
    }
}

#[cfg_attr(not(feature = "kafka"), allow(dead_code))]
/// `text` (a client's error message) with the value of every secret property of
/// `properties` replaced, and URL passwords scrubbed.
pub(crate) fn values<'a>(
    text: &str,
    properties: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> String {
    let mut out = urls(text);
    for (k, v) in properties {
        if is_secret(k) && !v.is_empty() {
            out = out.replace(v, REDACTED);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_passwords_are_redacted_wherever_they_stand() {
        assert_eq!(
            urls("failed to connect to amqp://guest:s3cret@127.0.0.1:5672/vh: refused"),
            "failed to connect to amqp://guest:<redacted>@127.0.0.1:5672/vh: refused"
        );
        assert_eq!(
            urls("oracle://scott:p@ss/w@rd@db:1521/svc"),
            "oracle://scott:<redacted>@db:1521/svc"
        );
        assert_eq!(
            urls("a postgres://u@h/d and mysql://r:x@h/d"),
            "a postgres://u@h/d and mysql://r:<redacted>@h/d"
        );
        assert_eq!(urls("no url here: x@y"), "no url here: x@y");
        assert_eq!(
            urls("host=db user=app Password=hunter2 dbname=x"),
            "host=db user=app Password=<redacted> dbname=x"
        );
        assert_eq!(
            urls("postgres://db/x?user=a&password=pw&sslmode=off"),
            "postgres://db/x?user=a&password=<redacted>&sslmode=off"
        );
    }

    #[test]
    fn secret_properties_are_redacted() {
        let map: BTreeMap<String, String> = [
            ("bootstrap.servers", "k:9092"),
            ("sasl.password", "hunter2"),
            ("ssl.key.password", "pw2"),
            ("sasl.oauthbearer.client.secret", "cs"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let shown = format!("{:?}", Properties(&map));
        for secret in ["hunter2", "pw2", "\"cs\""] {
            assert!(!shown.contains(secret), "{shown}");
        }
        assert!(shown.contains("k:9092"), "{shown}");
        assert_eq!(
            values(
                "bad value \"hunter2\" for sasl.password",
                map.iter().map(|(k, v)| (k.as_str(), v.as_str()))
            ),
            "bad value \"<redacted>\" for sasl.password"
        );
    }
}
