//! Statements parsed once: [`Stmt`] knows its text, its placeholders and the
//! order its values are bound in, and keeps its SQL rendered in the driver's
//! style; [`Ordered`] keeps a claim's variants per ordering rule.

use std::borrow::Cow;
use std::sync::OnceLock;

use super::{Common, Style, Val};
use crate::error::{Error, Result};
use crate::store::ClaimArgs;

/// One piece of a statement.
#[derive(Debug, Clone, PartialEq)]
enum Part {
    Text(String),
    /// `$n`: the n-th fixed value (from 1; `$0` names none and is refused
    /// when the statement is run).
    Param(usize),
    /// `{ids}`: a list of ids, one placeholder each, after the fixed values.
    Ids,
}

/// A statement of txbox's, parsed once: the text between its placeholders
/// (`$1`, `$2`, ... and an optional `{ids}` list), the fixed values it takes
/// (its highest `$n`) and, rendered the first time it runs, its SQL in the
/// driver's style with the order the driver binds its values in. A call binds
/// its values by that order; only a statement with an `{ids}` list is written
/// out again per call, for the list's length.
#[derive(Debug, Clone)]
pub struct Stmt {
    template: String,
    parts: Vec<Part>,
    /// The highest `$n`: how many fixed values it takes (the ids follow).
    arity: usize,
    /// Rendered without ids (a statement without `{ids}`), with its style.
    plain: OnceLock<(Style, Rendered)>,
}

/// A statement in a driver's style and the values it binds, in order:
/// indexes into the fixed values followed by the ids.
#[derive(Debug, Clone, PartialEq)]
struct Rendered {
    sql: String,
    order: Vec<usize>,
}

impl From<String> for Stmt {
    fn from(template: String) -> Self {
        Stmt::new(template)
    }
}

impl From<&str> for Stmt {
    fn from(template: &str) -> Self {
        Stmt::new(template.to_owned())
    }
}

impl Stmt {
    /// Parses `template`: `$n` placeholders and `{ids}`.
    pub(crate) fn new(template: String) -> Stmt {
        let mut parts = Vec::new();
        let mut text = String::new();
        let mut rest = template.as_str();
        while !rest.is_empty() {
            if let Some(after) = rest.strip_prefix("{ids}") {
                parts.push(Part::Text(std::mem::take(&mut text)));
                parts.push(Part::Ids);
                rest = after;
                continue;
            }
            let mut chars = rest.chars();
            let c = chars.next().unwrap_or_default();
            let digits = chars.as_str();
            let n_digits = digits.bytes().take_while(u8::is_ascii_digit).count();
            if c == '$' && n_digits > 0 {
                parts.push(Part::Text(std::mem::take(&mut text)));
                // more digits than a usize holds: past every value, refused
                // when run
                let n: usize = digits[..n_digits].parse().unwrap_or(usize::MAX);
                parts.push(Part::Param(n.min(MAX_PARAMS + 1)));
                rest = &digits[n_digits..];
            } else {
                text.push(c);
                rest = digits;
            }
        }
        parts.push(Part::Text(text));
        parts.retain(|p| !matches!(p, Part::Text(t) if t.is_empty()));
        let arity = parts
            .iter()
            .filter_map(|p| match p {
                Part::Param(n) => Some(*n),
                _ => None,
            })
            .max()
            .unwrap_or(0);
        Stmt {
            template,
            parts,
            arity,
            plain: OnceLock::new(),
        }
    }

    /// The statement as written (`$n`, `{ids}`).
    pub(crate) fn template(&self) -> &str {
        &self.template
    }

    /// Whether it takes a list of ids.
    pub(crate) fn has_ids(&self) -> bool {
        self.parts.contains(&Part::Ids)
    }

    /// A statement of this one with the text `hole` replaced by `with`
    /// (`{from}`, `{order}`: text, never values).
    pub(crate) fn fill(&self, hole: &str, with: &str) -> Stmt {
        Stmt::new(self.template.replace(hole, with))
    }

    /// Written out in `style` for `ids` ids.
    fn render(&self, style: Style, ids: usize) -> Result<Rendered> {
        let mut sql = String::with_capacity(self.template.len() + 6 * ids);
        let mut order = Vec::new();
        let mut put = |sql: &mut String, n: usize| {
            order.push(n - 1);
            match style {
                Style::Dollar => {
                    sql.push('$');
                    sql.push_str(&n.to_string());
                }
                Style::Question => sql.push('?'),
                Style::QuestionNumbered => {
                    sql.push('?');
                    sql.push_str(&n.to_string());
                }
                // Oracle binds by position, the order the placeholders appear
                // in, whatever their names: one bind per occurrence, so named
                Style::Colon => {
                    sql.push(':');
                    sql.push_str(&order.len().to_string());
                }
            }
        };
        for part in &self.parts {
            match part {
                Part::Text(t) => sql.push_str(t),
                Part::Param(n) if *n == 0 || *n > MAX_PARAMS => {
                    return Err(no_value(*n, &self.template))
                }
                Part::Param(n) => put(&mut sql, *n),
                Part::Ids => {
                    for (j, n) in (self.arity + 1..=self.arity + ids).enumerate() {
                        if j > 0 {
                            sql.push_str(", ");
                        }
                        put(&mut sql, n);
                    }
                }
            }
        }
        if matches!(style, Style::Dollar | Style::QuestionNumbered) {
            // numbered styles bind every number up to the highest one used
            let highest = order.iter().max().map_or(0, |m| m + 1);
            order = (0..highest).collect();
        }
        Ok(Rendered { sql, order })
    }

    /// The statement in `style` and its values in bind order (`fixed`, then
    /// `ids` for `{ids}`); an error for a placeholder without a value (never
    /// dropped, never a NULL). Without ids, the SQL is the one rendered the
    /// first time.
    pub(crate) fn bind(
        &self,
        style: Style,
        fixed: &[Val],
        ids: &[Val],
    ) -> Result<(Cow<'_, str>, Vec<Val>)> {
        let rendered = if self.has_ids() {
            Cow::Owned(self.render(style, ids.len())?)
        } else {
            self.rendered(style)?
        };
        let params = rendered
            .order
            .iter()
            .map(|&i| {
                let v = match i.checked_sub(self.arity) {
                    None => fixed.get(i),
                    Some(j) => ids.get(j),
                };
                v.cloned().ok_or_else(|| no_value(i + 1, &self.template))
            })
            .collect::<Result<Vec<_>>>()?;
        let sql = match rendered {
            Cow::Borrowed(r) => Cow::Borrowed(r.sql.as_str()),
            Cow::Owned(r) => Cow::Owned(r.sql),
        };
        Ok((sql, params))
    }

    /// Rendered in `style` without ids: kept from the first time.
    fn rendered(&self, style: Style) -> Result<Cow<'_, Rendered>> {
        match self.plain.get() {
            Some((s, r)) if *s == style => Ok(Cow::Borrowed(r)),
            Some(_) => Ok(Cow::Owned(self.render(style, 0)?)),
            None => {
                let r = self.render(style, 0)?;
                // another thread may have kept another style's meanwhile
                match self.plain.get_or_init(|| (style, r.clone())) {
                    (s, kept) if *s == style => Ok(Cow::Borrowed(kept)),
                    _ => Ok(Cow::Owned(r)),
                }
            }
        }
    }

    /// The statement with every placeholder written out as a literal of
    /// `fixed` (`$n`) or `ids` (`{ids}`); an error for a placeholder without
    /// a value (never a NULL in its place).
    pub(crate) fn inline(
        &self,
        fixed: &[Val],
        ids: &[Val],
        literal: fn(&Val) -> String,
    ) -> Result<String> {
        let mut sql = String::with_capacity(self.template.len() + 40 * ids.len());
        for part in &self.parts {
            match part {
                Part::Text(t) => sql.push_str(t),
                Part::Param(n) => {
                    let v = n.checked_sub(1).and_then(|i| fixed.get(i));
                    sql.push_str(&literal(v.ok_or_else(|| no_value(*n, &self.template))?));
                }
                Part::Ids => {
                    let list: Vec<String> = ids.iter().map(literal).collect();
                    sql.push_str(&list.join(", "));
                }
            }
        }
        Ok(sql)
    }
}

/// More values than any statement binds (PostgreSQL's limit): a higher `$n`
/// is refused, not bound up to.
const MAX_PARAMS: usize = 65_535;

/// A statement of txbox's own with a placeholder it passes no value for: a bug.
fn no_value(n: usize, template: &str) -> Error {
    Error::Internal(format!("placeholder ${n} has no value in: {template}"))
}

/// A claim statement with an `{order}` hole, filled in per claim by
/// [`Common::order`] (or [`Common::order_rule`]): each ordering's statement
/// is built the first time it runs and kept; only a claim bounded by an
/// insert mark ([`ClaimArgs::upto`], written into its SQL) is built per call.
#[derive(Debug, Clone)]
pub struct Ordered {
    template: String,
    /// By [`order_index`]: unordered, skip, block.
    claims: [OnceLock<Stmt>; 3],
    /// The rule alone ([`Common::order_rule`]), by the same index.
    rules: [OnceLock<Stmt>; 3],
}

impl From<String> for Ordered {
    fn from(template: String) -> Self {
        Ordered {
            template,
            claims: Default::default(),
            rules: Default::default(),
        }
    }
}

/// The slot of an ordering in [`Ordered`]'s variants.
fn order_index(ordered: Option<crate::OnPoison>) -> usize {
    match ordered {
        None => 0,
        Some(crate::OnPoison::Skip) => 1,
        Some(crate::OnPoison::Block) => 2,
    }
}

impl Ordered {
    /// The statement as written, `{order}` included.
    pub(crate) fn template(&self) -> &str {
        &self.template
    }

    /// The claim for `args`: its ordering's condition (a key walk where the
    /// dialect has one) and its insert bound filled in.
    pub(crate) fn claim(&self, common: &Common, args: &ClaimArgs<'_>) -> Cow<'_, Stmt> {
        let build = || Stmt::new(common.order(&self.template, args));
        if args.upto.is_some() {
            return Cow::Owned(build());
        }
        Cow::Borrowed(self.claims[order_index(args.ordered)].get_or_init(build))
    }

    /// The statement with the ordering's rule alone filled in.
    pub(crate) fn rule(&self, common: &Common, ordered: Option<crate::OnPoison>) -> &Stmt {
        self.rules[order_index(ordered)]
            .get_or_init(|| Stmt::new(common.order_rule(&self.template, ordered)))
    }
}
