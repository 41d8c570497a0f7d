//! The portal's message log and a message's page: the dashboard's finding
//! components ([`crate::dashboard::finder`]) with the session's application
//! as their scope, so every query is filtered by it and another
//! application's message is "not found".

use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};

use super::{Nav, PortalPosted, PortalResult, PortalSession};
use crate::api::{ApiError, ApiState};
use crate::dashboard::finder::{
    message_body, messages_search, MessagePageQuery, MessagesQuery, Scope, View,
};
use crate::dashboard::{see_other, DashError};

/// The session's view: its application only, links under `/portal`, resend
/// forms only with `CreateAttempts`.
async fn view_of(state: &ApiState, session: &PortalSession) -> PortalResult<View> {
    let app = state
        .store
        .get_app(session.app_id.as_str())
        .await?
        .ok_or(DashError::NotFound("application"))?;
    Ok(View {
        scope: Scope::App(app),
        base: super::HOME.to_owned(),
        can_resend: session.capabilities.create_attempts(),
        csrf: session.csrf_field(),
    })
}

/// `GET /portal/messages`: the application's messages, newest first, by
/// event type, id or `eventId`, delivery status and time.
pub async fn messages(
    session: PortalSession,
    State(state): State<ApiState>,
    Query(query): Query<MessagesQuery>,
) -> PortalResult {
    let view = view_of(&state, &session).await?;
    // The application comes from the session, never from the query.
    let query = MessagesQuery { app: None, ..query };
    let (status, body) = messages_search(&view, &state, &query).await?;
    let mut page = session.page("Messages", Nav::Messages, body);
    *page.status_mut() = status;
    Ok(page)
}

/// `GET /portal/msg/{msg_id}` (by id or `eventId`): the payload, each
/// endpoint's delivery and every attempt.
pub async fn message(
    session: PortalSession,
    State(state): State<ApiState>,
    Path(msg_id): Path<String>,
    Query(query): Query<MessagePageQuery>,
) -> PortalResult {
    let view = view_of(&state, &session).await?;
    let Scope::App(app) = &view.scope else {
        return Err(DashError::NotFound("application").into());
    };
    let after = query.after.filter(|a| !a.is_empty());
    let body = message_body(&view, &state, app, &msg_id, after).await?;
    Ok(session.page(&format!("Message {msg_id}"), Nav::Messages, body))
}

/// `POST /portal/msg/{msg_id}/endpoint/{endpoint_id}/resend`: one manual
/// attempt now (`CreateAttempts`), through the API's resend, audited as
/// the portal session.
pub async fn resend(
    State(state): State<ApiState>,
    Path((msg_id, endpoint_id)): Path<(String, String)>,
    posted: PortalPosted,
) -> PortalResult<Response> {
    let session = &posted.session;
    session.need(session.capabilities.create_attempts())?;
    let app_id = session.app_id.clone();
    let back = format!("{}/msg/{msg_id}", super::HOME);
    match crate::api::messages::resend_to(&state, &session.actor(), &app_id, &msg_id, &endpoint_id)
        .await
    {
        Ok(resent) => {
            let note = crate::dashboard::finder::resent_note(&resent);
            session.flash(note).await;
            Ok(see_other(&format!("{}/msg/{}", super::HOME, resent.msg_id)))
        }
        Err(ApiError::Conflict(why)) => {
            session.flash(format!("Not resent: {why}.")).await;
            Ok(see_other(&back))
        }
        Err(other) => Err(DashError::from(other).into()),
    }
    .map(IntoResponse::into_response)
}
