//! The finding tools' searches on PostgreSQL.

use super::apps::APP_COLUMNS;
use super::*;
use crate::store::finder::{add_counts, like_pattern};

#[async_trait]
impl Finder for PostgresStore {
    async fn find_messages(
        &self,
        filter: &FindFilter,
        page: &PageReq,
    ) -> StoreResult<Page<FoundMessage>> {
        let (cond, args) = postgres_where(filter.conditions(Dialect::Postgres { first: 1 }));
        let sql = format!(
            "SELECT m.id, m.app_id, a.name AS app_name, m.event_type, m.event_id, m.created_at \
             FROM messages m JOIN applications a ON a.id = m.app_id WHERE {cond}"
        );
        let mut found = self
            .page_of(&sql, "m.id", args, page, found_from_row)
            .await?;
        if found.items.is_empty() {
            return Ok(found);
        }
        let ids: Vec<String> = found
            .items
            .iter()
            .map(|m| m.id.as_str().to_owned())
            .collect();
        let rows = sqlx::query(
            "SELECT msg_id, state, count(*) AS n FROM deliveries \
             WHERE msg_id = ANY($1) GROUP BY msg_id, state",
        )
        .bind(&ids)
        .fetch_all(&self.pool)
        .await?;
        let counts = map_rows(&rows, |r| {
            Ok((
                get::<String>(r, "msg_id")?,
                i64::from(get::<i16>(r, "state")?),
                get::<i64>(r, "n")?,
            ))
        })?;
        add_counts(&mut found.items, counts);
        Ok(found)
    }

    async fn find_apps(&self, search: Option<&str>, page: &PageReq) -> StoreResult<Page<App>> {
        let mut sql = format!("SELECT {APP_COLUMNS} FROM applications WHERE TRUE");
        let mut args = Vec::new();
        if let Some(search) = search {
            sql.push_str(" AND (name ILIKE $1 ESCAPE '\\' OR uid = $2 OR id = $2)");
            args.push(like_pattern(search));
            args.push(search.to_owned());
        }
        self.page_of(&sql, "id", args, page, app_from_row).await
    }
}
