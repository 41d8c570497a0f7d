//! A filter's WHERE clause written once for both backends: each optional
//! part of a filter adds a fragment whose `#` becomes the backend's
//! placeholder for its value (`?` on SQLite; `$n` on PostgreSQL, cast there
//! to the value's type since its arguments are bound as text). Only
//! constant fragments are spliced into the SQL; every value is bound.

use super::Millis;

/// A value bound to a placeholder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Arg {
    Text(String),
    Int(i64),
    Flag(bool),
}

impl From<String> for Arg {
    fn from(v: String) -> Self {
        Arg::Text(v)
    }
}

impl From<&str> for Arg {
    fn from(v: &str) -> Self {
        Arg::Text(v.to_owned())
    }
}

impl From<Millis> for Arg {
    fn from(v: Millis) -> Self {
        Arg::Int(v)
    }
}

impl From<bool> for Arg {
    fn from(v: bool) -> Self {
        Arg::Flag(v)
    }
}

/// How a backend writes its placeholders.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dialect {
    Sqlite,
    /// Numbered from `first` (the statement's own parameters before the
    /// filter's take the numbers below it).
    Postgres {
        first: usize,
    },
}

/// A WHERE clause (without `WHERE`) and its arguments, in order.
#[derive(Debug)]
pub(crate) struct Conditions {
    pub(crate) sql: String,
    pub(crate) args: Vec<Arg>,
    dialect: Dialect,
}

impl Conditions {
    /// Starts with `first`, a condition without arguments (`1 = 1` for none).
    pub(crate) fn new(dialect: Dialect, first: &str) -> Self {
        Conditions {
            sql: first.to_owned(),
            args: Vec::new(),
            dialect,
        }
    }

    /// Appends `fragment` (` AND …`), each `#` in it bound to `value`.
    pub(crate) fn and(&mut self, fragment: &str, value: impl Into<Arg>) {
        let value = value.into();
        let placeholder = match self.dialect {
            Dialect::Sqlite => "?".to_owned(),
            Dialect::Postgres { first } => {
                let n = first + self.args.len();
                match value {
                    Arg::Text(_) => format!("${n}"),
                    Arg::Int(_) => format!("${n}::int8"),
                    Arg::Flag(_) => format!("${n}::bool"),
                }
            }
        };
        // PostgreSQL names one parameter however often it is used; SQLite's
        // `?` takes the next argument each time, so it is bound again.
        let uses = fragment.matches('#').count();
        let binds = match self.dialect {
            Dialect::Sqlite => uses,
            Dialect::Postgres { .. } => uses.min(1),
        };
        self.sql.push_str(&fragment.replace('#', &placeholder));
        self.args.extend(std::iter::repeat_n(value, binds));
    }

    /// [`Conditions::and`] when there is a value; nothing without one.
    pub(crate) fn and_some<T: Into<Arg>>(&mut self, fragment: &str, value: Option<T>) {
        if let Some(v) = value {
            self.and(fragment, v);
        }
    }

    /// Appends a fragment without arguments.
    pub(crate) fn push(&mut self, fragment: &str) {
        self.sql.push_str(fragment);
    }

    /// The dialect conditions nested in these (a subquery's) are built
    /// in: PostgreSQL's parameters go on from these ones'.
    pub(crate) fn next_dialect(&self) -> Dialect {
        match self.dialect {
            Dialect::Sqlite => Dialect::Sqlite,
            Dialect::Postgres { first } => Dialect::Postgres {
                first: first + self.args.len(),
            },
        }
    }

    /// Appends `inner` (built in [`Conditions::next_dialect`]) between
    /// `before` and `after`, with its arguments.
    pub(crate) fn push_nested(&mut self, before: &str, inner: Conditions, after: &str) {
        self.sql.push_str(before);
        self.sql.push_str(&inner.sql);
        self.sql.push_str(after);
        self.args.extend(inner.args);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn both(build: impl Fn(&mut Conditions)) -> [(String, Vec<Arg>); 2] {
        [Dialect::Sqlite, Dialect::Postgres { first: 2 }].map(|d| {
            let mut c = Conditions::new(d, "1 = 1");
            build(&mut c);
            (c.sql, c.args)
        })
    }

    #[test]
    fn each_backend_gets_its_placeholders_and_arguments() {
        let [sqlite, pg] = both(|c| {
            c.and(" AND a = #", "x");
            c.and_some(" AND b < #", None::<Millis>);
            c.and_some(" AND c >= #", Some(7));
            c.and(" AND (d = # OR e = #)", "k");
            c.and(" AND f = #", true);
            c.push(" AND g IS NULL");
        });
        assert_eq!(
            sqlite.0,
            "1 = 1 AND a = ? AND c >= ? AND (d = ? OR e = ?) AND f = ? AND g IS NULL"
        );
        let k = || Arg::Text("k".into());
        assert_eq!(
            sqlite.1,
            [
                Arg::Text("x".into()),
                Arg::Int(7),
                k(),
                k(),
                Arg::Flag(true)
            ]
        );
        assert_eq!(
            pg.0,
            "1 = 1 AND a = $2 AND c >= $3::int8 AND (d = $4 OR e = $4) AND f = $5::bool AND g IS NULL"
        );
        assert_eq!(
            pg.1,
            [Arg::Text("x".into()), Arg::Int(7), k(), Arg::Flag(true)]
        );
    }

    /// A subquery's conditions number PostgreSQL's parameters on from the
    /// outer ones', and those after it on from its own.
    #[test]
    fn nested_conditions_number_on() {
        let [sqlite, pg] = both(|c| {
            c.and(" AND a = #", "x");
            let mut inner = Conditions::new(c.next_dialect(), "1 = 1");
            inner.and(" AND b = #", 1);
            c.push_nested(" AND id IN (SELECT id FROM t WHERE ", inner, ")");
            c.and(" AND c = #", "y");
        });
        assert_eq!(
            sqlite.0,
            "1 = 1 AND a = ? AND id IN (SELECT id FROM t WHERE 1 = 1 AND b = ?) AND c = ?"
        );
        assert_eq!(
            pg.0,
            "1 = 1 AND a = $2 AND id IN (SELECT id FROM t WHERE 1 = 1 AND b = $3::int8) AND c = $4"
        );
        assert_eq!(
            pg.1,
            [Arg::Text("x".into()), Arg::Int(1), Arg::Text("y".into())]
        );
        assert_eq!(sqlite.1, pg.1);
    }
}
