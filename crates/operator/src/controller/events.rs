//! The controller's events: what one reconcile changed, told as one event
//! ([`Changes`]), and the publisher that writes events one at a time off the reconcile's
//! path, yielding to reconciles while every slot is taken ([`Events`]).

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::Resource;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use memcached_api::Memcached;
use std::time::Duration;
use tokio::sync::mpsc;
use tracing::warn;

use crate::triggers::Busy;

/// The events of one controller, queued for the publisher.
#[derive(Clone)]
pub struct Events(mpsc::Sender<QueuedEvent>);

impl Events {
    /// Starts the publisher (see [`spawn_event_publisher`]); an event waits for a free
    /// reconcile slot at most `max_hold` ([`EVENT_MAX_HOLD`] unless a test says otherwise).
    pub fn start(client: Client, reporter: Reporter, busy: Busy, max_hold: Duration) -> Self {
        Events(spawn_event_publisher(client, reporter, busy, max_hold))
    }

    /// Queues an event about `mc`.
    pub fn publish(
        &self,
        mc: &Memcached,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        self.publish_event(
            mc,
            Event {
                type_,
                reason: reason.to_string(),
                note: Some(truncate(note, EVENT_NOTE_MAX)),
                action: action.to_string(),
                secondary: None,
            },
        );
    }

    /// Queues `event` about `mc`.
    pub fn publish_event(&self, mc: &Memcached, event: Event) {
        // Events are informational: published off the reconcile's critical path.
        let queued = (event, mc.object_ref(&()), tokio::time::Instant::now());
        if let Err(e) = self.0.try_send(queued) {
            let (event, reference, _) = e.into_inner();
            warn!(
                object = reference.name.as_deref().unwrap_or_default(),
                reason = event.reason,
                "event queue full ({EVENT_QUEUE} waiting) or closed: event dropped"
            );
        }
    }
}

/// An event waiting to be published: what, about which object, since when.
type QueuedEvent = (Event, ObjectReference, tokio::time::Instant);

/// How long an event may be held back while the controller is busy.
pub const EVENT_MAX_HOLD: Duration = Duration::from_secs(10);
/// Events waiting beyond this many are dropped, as client-go's broadcaster drops them beyond
/// 1,000; here a mass creation of 10,000 Memcacheds still gets every event.
const EVENT_QUEUE: usize = 10_000;

/// Publishes queued events one at a time, oldest first, as client-go's event broadcaster
/// does. Each write competes with the reconciles for the API server, and an event is
/// informational, so while every reconcile slot is taken ([`Busy`]) the next event waits, at
/// most [`EVENT_MAX_HOLD`]; its timestamp is then the time it was published.
///
/// kube-runtime's `Recorder` turns an event into a series of the last one with the same
/// object, type, reason and action seen in the past 6 minutes, keeping that one's note: right
/// for a failure that repeats, wrong for changes (a second scaling would show as the first
/// one counted twice). So warnings go through one shared `Recorder`, and each Normal event
/// (a change, whose note says which) through a fresh one, which also keeps it out of the
/// shared 6-minute cache.
fn spawn_event_publisher(
    client: Client,
    reporter: Reporter,
    busy: Busy,
    max_hold: Duration,
) -> mpsc::Sender<QueuedEvent> {
    let (tx, mut rx) = mpsc::channel::<QueuedEvent>(EVENT_QUEUE);
    let warnings = Recorder::new(client.clone(), reporter.clone());
    tokio::spawn(async move {
        while let Some((event, reference, queued_at)) = rx.recv().await {
            busy.wait_idle(queued_at, max_hold).await;
            let published = match event.type_ {
                EventType::Warning => warnings.publish(&event, &reference).await,
                EventType::Normal => {
                    Recorder::new(client.clone(), reporter.clone())
                        .publish(&event, &reference)
                        .await
                }
            };
            if let Err(e) = published {
                warn!(error = %e, reason = event.reason, "could not publish event");
            }
        }
    });
    tx
}

/// What one reconcile changed, published as a single event when it ends: a new Memcached
/// gets one "Created Deployment …; Created Service …; …" event instead of one per child,
/// which saves the API server three writes per object.
#[derive(Default)]
pub struct Changes(Vec<Change>);

struct Change {
    reason: &'static str,
    action: String,
    note: String,
}

/// The API server rejects an event note longer than 1 KiB.
pub const EVENT_NOTE_MAX: usize = 1024;

impl Changes {
    pub fn push(&mut self, reason: &'static str, action: String, note: String) {
        self.0.push(Change {
            reason,
            action,
            note,
        });
    }

    /// One Normal event for everything in `self` (none if nothing changed). A single change
    /// keeps its own reason and action; several are reported under the first one's reason
    /// with the action `Reconcile`, their notes joined by "; ".
    pub fn into_event(self) -> Option<Event> {
        let reason = self.0.first()?.reason.to_string();
        let (action, notes): (Vec<String>, Vec<String>) =
            self.0.into_iter().map(|c| (c.action, c.note)).unzip();
        let action = match <[String; 1]>::try_from(action) {
            Ok([only]) => only,
            Err(_) => "Reconcile".to_string(),
        };
        Some(Event {
            type_: EventType::Normal,
            reason,
            note: Some(truncate(notes.join("; "), EVENT_NOTE_MAX)),
            action,
            secondary: None,
        })
    }
}

/// `text` cut to at most `max` bytes, on a character boundary, marked with "…" when cut.
pub fn truncate(mut text: String, max: usize) -> String {
    if text.len() <= max {
        return text;
    }
    let mut end = max - '…'.len_utf8();
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text.push('…');
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_event_per_reconcile_names_every_change() {
        assert!(
            Changes::default().into_event().is_none(),
            "no change, no event"
        );

        let mut one = Changes::default();
        one.push(
            "Scaled",
            "ScaleDeployment".into(),
            "Scaled Deployment a from 1 to 2 replicas".into(),
        );
        let event = one.into_event().expect("an event");
        assert_eq!(
            (event.reason.as_str(), event.action.as_str()),
            ("Scaled", "ScaleDeployment")
        );

        let mut created = Changes::default();
        created.push(
            "Created",
            "CreateDeployment".into(),
            "Created Deployment a with 3 replicas".into(),
        );
        created.push(
            "Created",
            "CreateService".into(),
            "Created Service a".into(),
        );
        created.push(
            "Created",
            "CreatePodDisruptionBudget".into(),
            "Created PodDisruptionBudget a".into(),
        );
        let event = created.into_event().expect("an event");
        assert_eq!(event.reason, "Created");
        assert_eq!(event.action, "Reconcile");
        assert_eq!(
            event.note.as_deref(),
            Some(
                "Created Deployment a with 3 replicas; Created Service a; \
                 Created PodDisruptionBudget a"
            )
        );
    }

    #[test]
    fn event_notes_fit_the_api_limit_on_a_character_boundary() {
        let long = "é".repeat(EVENT_NOTE_MAX);
        let cut = truncate(long, EVENT_NOTE_MAX);
        assert!(cut.len() <= EVENT_NOTE_MAX, "{}", cut.len());
        assert!(cut.ends_with('…'));
        assert_eq!(truncate("short".into(), EVENT_NOTE_MAX), "short");
    }
}
