//! The HTTP/1.1 the admin endpoint speaks: one request per connection, its head
//! parsed with `httparse`, its body read up to a limit, each within a deadline;
//! the answer written and the connection closed.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::{Duration, Instant};

use super::{MAX_BODY, MAX_HEAD};

/// What `handle` needs of a request.
pub(super) struct Call {
    pub(super) method: String,
    pub(super) url: String,
}

/// A response: status, content type and body.
pub(super) struct Resp {
    pub(super) code: u16,
    pub(super) content_type: &'static str,
    pub(super) body: String,
}

fn reason(code: u16) -> &'static str {
    match code {
        200 => "OK",
        204 => "No Content",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        411 => "Length Required",
        413 => "Payload Too Large",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        _ => "Internal Server Error",
    }
}

/// Writes `r` and closes the connection. With `linger`, what the client still
/// sends (a body that was not read) is read and dropped for a moment first, so
/// the close does not reset the connection before the client read the answer.
pub(super) fn answer(mut stream: TcpStream, r: &Resp, linger: bool) {
    let head = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        r.code,
        reason(r.code),
        r.content_type,
        r.body.len()
    );
    let _ = stream
        .write_all(head.as_bytes())
        .and_then(|()| stream.write_all(r.body.as_bytes()))
        .and_then(|()| stream.flush());
    let _ = stream.shutdown(Shutdown::Write);
    if linger {
        let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
        let deadline = Instant::now() + Duration::from_millis(500);
        let mut sink = [0u8; 8192];
        let mut drained = 0;
        while Instant::now() < deadline && drained < MAX_BODY {
            match stream.read(&mut sink) {
                Ok(0) | Err(_) => break,
                Ok(n) => drained += n,
            }
        }
    }
}

/// The request head: method, target, `Authorization`, `Content-Length`, and
/// the body bytes that came with it.
pub(super) struct Head {
    pub(super) call: Call,
    pub(super) auth: Option<String>,
    pub(super) length: Option<usize>,
    pub(super) chunked: bool,
    pub(super) rest: Vec<u8>,
}

/// Reads and parses the request line and headers (`httparse`), at most
/// [`MAX_HEAD`] bytes, before `deadline`.
pub(super) fn read_head(
    stream: &mut TcpStream,
    deadline: Instant,
) -> std::result::Result<Head, Resp> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    loop {
        if Instant::now() > deadline {
            return Err(err(408, "the request did not arrive in time"));
        }
        match stream.read(&mut chunk) {
            Ok(0) => return Err(err(400, "the connection closed before the request ended")),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return Err(err(408, "the request did not arrive in time")),
        }
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(&buf) {
            Ok(httparse::Status::Complete(n)) => {
                let header = |name: &str| {
                    req.headers
                        .iter()
                        .find(|h| h.name.eq_ignore_ascii_case(name))
                        .map(|h| String::from_utf8_lossy(h.value).trim().to_string())
                };
                let length = match header("Content-Length") {
                    None => None,
                    Some(v) => Some(
                        v.parse::<usize>()
                            .map_err(|_| err(400, "Content-Length is not a number"))?,
                    ),
                };
                return Ok(Head {
                    call: Call {
                        method: req.method.unwrap_or_default().to_string(),
                        url: req.path.unwrap_or_default().to_string(),
                    },
                    auth: header("Authorization"),
                    length,
                    chunked: header("Transfer-Encoding").is_some(),
                    rest: buf[n..].to_vec(),
                });
            }
            Ok(httparse::Status::Partial) if buf.len() <= MAX_HEAD => {}
            Ok(httparse::Status::Partial) => {
                return Err(err(
                    431,
                    &format!("request head larger than {MAX_HEAD} bytes"),
                ))
            }
            Err(e) => return Err(err(400, &format!("malformed request: {e}"))),
        }
    }
}

/// Reads the body `head` announced, at most [`MAX_BODY`] bytes, before
/// `deadline`.
pub(super) fn read_body(
    stream: &mut TcpStream,
    head: Head,
    deadline: Instant,
) -> std::result::Result<Vec<u8>, Resp> {
    if head.chunked {
        return Err(err(411, "send the body with a Content-Length"));
    }
    let length = head.length.unwrap_or(0);
    if length > MAX_BODY {
        return Err(err(
            413,
            &format!("request body larger than {MAX_BODY} bytes"),
        ));
    }
    let mut body = head.rest;
    let mut chunk = [0u8; 8192];
    while body.len() < length {
        if Instant::now() > deadline {
            return Err(err(408, "the request body did not arrive in time"));
        }
        match stream.read(&mut chunk) {
            Ok(0) => return Err(err(400, "the connection closed before the body ended")),
            Ok(n) => body.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return Err(err(408, "the request body did not arrive in time")),
        }
    }
    body.truncate(length);
    Ok(body)
}

pub(super) fn reply(code: u16, body: &str) -> Resp {
    Resp {
        code,
        content_type: "application/json",
        body: body.to_string(),
    }
}

pub(super) fn error_json(msg: &str) -> String {
    serde_json::json!({ "error": msg }).to_string()
}

pub(super) fn err(code: u16, msg: &str) -> Resp {
    reply(code, &error_json(msg))
}
