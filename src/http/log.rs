//! Log lines written while a request is answered carry its ID.
//!
//! A span per request would do this too, but the log layer formats a
//! span's fields when the span is made, on every request, where almost
//! none log anything: a tenth of a small GET's user time went to it. The
//! ID is kept in the request's task instead, and added to a line only when
//! a line is written.

use std::future::Future;

use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::FormatFields;
use tracing_subscriber::fmt::format::{DefaultFields, Writer};

tokio::task_local! {
    static REQUEST: String;
}

/// Runs `answer` as the request `id`'s handler.
pub(super) fn scope<F: Future>(id: String, answer: F) -> impl Future<Output = F::Output> {
    REQUEST.scope(id, answer)
}

/// The log's fields, then `request_id=` with the ID of the request being
/// answered, if any; the log layer's `fmt_fields`.
#[derive(Debug, Default)]
pub struct RequestFields(DefaultFields);

impl<'w> FormatFields<'w> for RequestFields {
    fn format_fields<R: RecordFields>(&self, mut writer: Writer<'w>, fields: R) -> std::fmt::Result {
        self.0.format_fields(writer.by_ref(), fields)?;
        REQUEST.try_with(|id| write!(writer, " request_id={id}")).unwrap_or(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn formatted(event: impl FnOnce()) -> String {
        #[derive(Clone, Default)]
        struct Lines(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
        impl std::io::Write for Lines {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let lines = Lines::default();
        let kept = lines.clone();
        let subscriber = tracing_subscriber::fmt()
            .fmt_fields(RequestFields::default())
            .with_writer(move || lines.clone())
            .without_time()
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(subscriber, event);
        String::from_utf8(kept.0.lock().unwrap().clone()).unwrap()
    }

    #[test]
    fn lines_written_while_answering_carry_the_request_id() {
        let inside = formatted(|| REQUEST.sync_scope("7f3a".into(), || tracing::warn!(code = 5, "disk gone")));
        assert!(inside.trim_end().ends_with("disk gone code=5 request_id=7f3a"), "{inside}");
        let outside = formatted(|| tracing::warn!(code = 5, "disk gone"));
        assert!(outside.trim_end().ends_with("disk gone code=5"), "{outside}");
    }
}
