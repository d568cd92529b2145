//! Rows to events and dead letters, events to rows.

use super::{
    is, missing, run_execute, run_query, shift, unexpected, Catalog, Conn, Row, Stmt, Val,
};
use crate::error::{Error, Result};
use crate::event::{Body, Event, EventId, NewEvent};
use crate::store::{DeadLetter, DlqStatus, HEADER_DEFECT};
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::time::Duration;

/// The ids in the first column of `rows`, as parameters.
pub(crate) fn id_vals(rows: &[Row]) -> Result<Vec<Val>> {
    rows.iter()
        .map(|r| r.get::<EventId>(0).map(|i| Val::Id(i.as_uuid())))
        .collect()
}

pub(crate) fn ms(d: Duration) -> Val {
    Val::Float(d.as_secs_f64() * 1000.0)
}

pub(crate) fn ids_of(ids: &[EventId]) -> Vec<Val> {
    ids.iter().map(|i| Val::Id(i.as_uuid())).collect()
}

pub(crate) fn status_list(s: &[DlqStatus]) -> String {
    // enum names, never user input
    s.iter()
        .map(|s| format!("'{}'", s.as_str()))
        .collect::<Vec<_>>()
        .join(", ")
}

pub(crate) fn parse_headers(text: &str) -> Result<BTreeMap<String, String>> {
    if text == "{}" {
        return Ok(BTreeMap::new()); // most events have none
    }
    match serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(text) {
        Ok(map) => Ok(map
            .into_iter()
            .map(|(k, v)| match v {
                serde_json::Value::String(s) => (k, s),
                other => (k, other.to_string()),
            })
            .collect()),
        Err(e) => Err(Error::database(
            crate::error::DatabaseErrorKind::Other,
            format!("the headers column holds no JSON object ({e}): {text:.80}"),
        )),
    }
}

/// The headers of a row whose headers column could not be read: only
/// [`HEADER_DEFECT`], saying why.
fn defect(e: Error) -> BTreeMap<String, String> {
    let why = match e {
        Error::Database { source, .. } => source.to_string(),
        other => other.to_string(),
    };
    BTreeMap::from([(HEADER_DEFECT.to_owned(), why)])
}

pub(crate) fn headers_json(h: &BTreeMap<String, String>) -> String {
    serde_json::to_string(h).unwrap_or_else(|_| "{}".into())
}

/// The event of a claimed row (id, type, key, headers, payload, attempts,
/// payload bytes, content type), its text moved out of the row.
pub(crate) fn event_row(r: &mut Row) -> Result<Event> {
    let id = r.get::<EventId>(0)?;
    // parsed once: later reads of the id find it as such
    r.0[0] = Val::Id(id.as_uuid());
    // headers that are no JSON object (a row written by hand): the event is
    // marked, and the relay fails it alone. An error here would fail the
    // whole claimed batch, again at every claim: one bad row would hold back
    // every event claimed with it.
    let headers = match r.val(3) {
        Val::Text(text) => parse_headers(text),
        _ => parse_headers(&r.get::<String>(3)?),
    }
    .unwrap_or_else(defect);
    let (payload, content_type) = body(r, 4, 6)?;
    Ok(Event {
        id,
        event_type: r.take_text(1)?.ok_or_else(|| missing(1))?,
        destination: String::new(),
        key: r.take_text(2)?,
        headers,
        payload,
        content_type,
        attempts: r.get(5)?,
    })
}

/// The payload of a row whose text payload is column `text` and whose payload
/// bytes and content type follow from column `bytes` on: the bytes when it has a
/// content type (published as bytes), else the JSON text.
fn body(r: &mut Row, text: usize, bytes: usize) -> Result<(Vec<u8>, Option<String>)> {
    Ok(match r.take_text(bytes + 1)? {
        Some(content_type) => (r.take_blob(bytes)?.unwrap_or_default(), Some(content_type)),
        None => (r.take_bytes(text)?.ok_or_else(|| missing(text))?, None),
    })
}

/// The events of claimed rows, sorted by id.
pub(crate) fn claimed_events(rows: &mut [Row]) -> Result<Vec<Event>> {
    let mut events = rows.iter_mut().map(event_row).collect::<Result<Vec<_>>>()?;
    events.sort_by_key(|e| e.id);
    Ok(events)
}

pub(crate) fn dead_letter(r: &mut Row) -> Result<DeadLetter> {
    let (payload, content_type) = body(r, 4, 10)?;
    Ok(DeadLetter {
        id: r.get::<EventId>(0)?,
        event_type: r.get::<String>(1)?,
        key: r.get::<Option<String>>(2)?,
        // a dead letter's unreadable headers (it was failed for them) are
        // listed as what is wrong with them: one such row must not keep the
        // others from being listed, retried or deleted
        headers: parse_headers(&r.get::<String>(3)?).unwrap_or_else(defect),
        payload,
        content_type,
        attempts: r.get(5)?,
        last_error: r.get::<Option<String>>(6)?,
        status: {
            let status = r.get::<String>(7)?;
            status
                .parse()
                .map_err(|_| unexpected(7, "a dead-letter status", &Val::Text(status)))?
        },
        created_at: r.get::<String>(8)?,
        moved_at: r.get::<String>(9)?,
    })
}

/// Inserts new events: one multi-row `INSERT` (one round trip) per chunk. A
/// call without an event published as bytes writes only the JSON columns.
pub(crate) fn insert_events(conn: &mut dyn Conn, d: &Catalog, events: &[NewEvent]) -> Result<()> {
    let shape = Shape {
        bytes: events.iter().any(|e| e.content_type().is_some()),
        delayed: events.iter().any(|e| e.delay.is_some()),
    };
    let width = shape.width();
    for chunk in events.chunks((d.max_ids / width).clamp(1, d.insert_rows_max)) {
        let mut params = Vec::with_capacity(chunk.len() * width);
        for e in chunk {
            push_event_values(e, shape, &mut params);
        }
        let stmt = insert_events_stmt(d, chunk.len(), shape);
        run_execute(conn, d, &stmt, &params, &[])?;
    }
    Ok(())
}

/// The dialect's `INSERT` of `rows` events: the one-event statements are
/// built the first time and kept ([`Catalog::insert_one`]), a batch's per call.
fn insert_events_stmt(d: &Catalog, rows: usize, shape: Shape) -> Cow<'_, Stmt> {
    if rows == 1 {
        Cow::Borrowed(insert_one(d, shape))
    } else {
        Cow::Owned(Stmt::new(insert_events_sql(d, rows, shape)))
    }
}

/// The dialect's `INSERT` of one event, kept in [`Catalog::insert_one`].
pub(crate) fn insert_one(d: &Catalog, shape: Shape) -> &Stmt {
    let slot = usize::from(shape.bytes) + 2 * usize::from(shape.delayed);
    d.insert_one[slot].get_or_init(|| Stmt::new(insert_events_sql(d, 1, shape)))
}

/// What an `INSERT` of events writes besides the JSON columns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Shape {
    /// The binary payload columns (an event published as bytes).
    pub(crate) bytes: bool,
    /// A due time of its own (a delayed event), else "now".
    pub(crate) delayed: bool,
}

impl Shape {
    /// How many values [`push_event_values`] writes of an event: id, type,
    /// key, headers, payload; with `bytes` the payload bytes and content
    /// type; with `delayed` the delay in milliseconds (the last).
    const fn width(self) -> usize {
        5 + if self.bytes { 2 } else { 0 } + if self.delayed { 1 } else { 0 }
    }
}

/// The dialect's `INSERT` of `rows` events, [`push_event_values`] of each in
/// turn; with `bytes`, the binary payload columns too.
fn insert_events_sql(d: &Catalog, rows: usize, shape: Shape) -> String {
    let (columns, values) = if shape.bytes {
        (", payload_bytes, content_type", d.insert_bytes_values)
    } else {
        ("", "")
    };
    let width = shape.width();
    // a delayed event's due time: the database's clock at the publish call
    // plus its delay (the row's last value)
    let due = if shape.delayed {
        (d.publish_plus.unwrap_or(d.common.plus))(&format!("${width}"))
    } else {
        d.common.now.to_owned()
    };
    let fill = |t: &str| {
        t.replace("{bytes_columns}", columns)
            .replace("{bytes_values}", values)
            .replace("{due}", &due)
    };
    let row = fill(&d.insert_event_row);
    let mut template = fill(&d.insert_events);
    for i in 0..rows {
        if i > 0 {
            template.push_str(d.insert_events_sep);
        }
        template.push_str(&shift(&row, i * width));
    }
    template.push_str(d.insert_events_suffix);
    template
}

/// The stored payload of an event: its JSON text, or (published as bytes) an
/// empty text, the bytes and the content type.
pub(crate) fn stored_payload(payload: &Body) -> [Val; 3] {
    match payload {
        Body::Json(s) => [Val::Text(s.clone()), Val::Null, Val::Null],
        Body::Bytes {
            bytes,
            content_type,
        } => [
            Val::Text(String::new()),
            Val::Bytes(bytes.clone()),
            Val::Text(content_type.clone()),
        ],
    }
}

/// What [`insert_events_sql`] writes of one event: id, type, key, headers,
/// payload, and with `shape.bytes` the payload bytes and content type, with
/// `shape.delayed` its delay (0 for one due at once).
pub(crate) fn push_event_values(e: &NewEvent, shape: Shape, out: &mut Vec<Val>) {
    let [text, blob, content_type] = stored_payload(&e.payload);
    out.extend([
        Val::Id(e.id.as_uuid()),
        Val::Text(e.event_type.clone()),
        e.key.as_deref().into(),
        Val::Text(headers_json(&e.headers)),
        text,
    ]);
    if shape.bytes {
        out.extend([blob, content_type]);
    }
    if shape.delayed {
        out.push(ms(e.delay.unwrap_or_default()));
    }
}

/// Records ids; returns the new ones. The unique key decides: a conflicting insert
/// waits for the other transaction and then affects no row (or, on Oracle, fails
/// with a unique violation).
pub(crate) fn insert_inbox_ids(
    conn: &mut dyn Conn,
    d: &Catalog,
    consumer: &str,
    ids: &[EventId],
) -> Result<Vec<EventId>> {
    crate::tables::validate_consumer(consumer)?;
    // the ids recorded before the per-consumer key, asked for once per call
    let mut legacy = std::collections::HashSet::new();
    if let Some(sql) = &d.inbox_legacy {
        for chunk in ids.chunks(d.max_ids) {
            let vals: Vec<Val> = chunk.iter().map(|id| Val::Id(id.as_uuid())).collect();
            for r in run_query(conn, d, sql, &[], &vals)? {
                legacy.insert(r.get::<EventId>(0)?);
            }
        }
    }
    let mut new = Vec::new();
    for id in ids.iter().filter(|id| !legacy.contains(id)) {
        let values = [consumer.into(), Val::Id(id.as_uuid())];
        match run_execute(conn, d, &d.inbox_insert, &values, &[]) {
            Ok(1) => new.push(*id),
            Ok(_) => {}
            Err(e) if is(&e, crate::error::DatabaseErrorKind::UniqueViolation) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(new)
}
