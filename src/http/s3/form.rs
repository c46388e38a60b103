//! Browser form uploads (POST with a policy): the `${filename}` in a form's
//! `key` is the uploaded file's name, as S3 has it. The protocol layer
//! takes the key as written, so every upload through one form landed on
//! one key, each replacing the last. The fields come before the file, so
//! the form is read up to the file's part, its key rewritten, and the rest
//! passed on as it comes.

use bytes::{Bytes, BytesMut};
use futures::{StreamExt, TryStreamExt};
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};

use crate::http::limits::RequestBody;

/// Most of a form read before its file: its fields, which S3 bounds at
/// 20 KB, with room for the parts' own headers. The protocol layer is held
/// to it too.
pub(super) const MAX_FIELDS: usize = 64 * 1024;

/// Most times the form read so far is looked through for its file: S3
/// takes 20 fields or so.
const MAX_LOOKS: usize = 64;

/// Largest piece the form's file is handed on in. Where a piece ends in
/// what may begin the form's closing boundary (a CR), the protocol layer
/// holds it together with the whole next piece, and refuses the form when
/// that passes 64 KiB: pieces as large as the socket gives (often more)
/// failed most files of a few megabytes.
const MAX_PIECE: usize = 32 * 1024;

/// What S3 replaces with the file's name.
const FILENAME: &str = "${filename}";

/// The boundary of a `multipart/form-data` body.
pub(super) fn boundary(headers: &http::HeaderMap) -> Option<String> {
    let value = headers.get(http::header::CONTENT_TYPE)?.to_str().ok()?;
    let (kind, params) = value.split_once(';')?;
    if !kind.trim().eq_ignore_ascii_case("multipart/form-data") {
        return None;
    }
    params.split(';').find_map(|p| {
        let (name, value) = p.trim().split_once('=')?;
        name.eq_ignore_ascii_case("boundary").then(|| value.trim_matches('"').to_string())
    })
}

/// A form as the protocol layer is to read it.
pub(super) struct Form {
    /// Its key's `${filename}` replaced by the file's name.
    pub body: s3s::Body,
    /// Whether a signature field comes before its file.
    pub signed: bool,
    /// The names of the fields before its file, in lower case.
    pub fields: Vec<String>,
}

/// The form `body` (with `boundary`) read up to its file ([`Form`]);
/// `length` is its Content-Length, changed to match.
pub(super) async fn with_filename(
    mut body: RequestBody,
    boundary: &str,
    length: &mut Option<u64>,
) -> Result<Form, s3s::StdError> {
    let mut head = BytesMut::new();
    let (mut ended, mut looks) = (false, 0);
    // The form is looked through again only when a part's headers may have
    // ended, and a few times at most: a form sent a byte at a time, or made
    // of many empty parts, costs no more.
    while head.len() < MAX_FIELDS && looks < MAX_LOOKS {
        let Some(frame) = body.frame().await else {
            ended = true;
            break;
        };
        let Ok(data) = frame?.into_data() else { continue };
        let from = head.len().saturating_sub(3);
        head.extend_from_slice(&data);
        if find(&head[from..], b"\r\n\r\n").is_some() {
            looks += 1;
            if file_part(&head, boundary).is_some() {
                break;
            }
        }
    }
    if !ended && file_part(&head, boundary).is_none() {
        return Err(format!("the form's file does not come within its first {MAX_FIELDS} bytes").into());
    }
    let fields = fields(&head, boundary);
    let signed = signed(&fields);
    let head = match rewrite(&head, boundary) {
        Some(rewritten) => {
            *length = length.map(|n| n.saturating_sub(head.len() as u64).saturating_add(rewritten.len() as u64));
            Bytes::from(rewritten)
        }
        None => head.freeze(),
    };
    let first = futures::stream::once(async move { Ok::<_, s3s::StdError>(Frame::data(head)) });
    if ended {
        return Ok(Form { body: s3s::Body::http_body(StreamBody::new(first)), signed, fields });
    }
    let rest = body
        .into_data_stream()
        .map_err(s3s::StdError::from)
        .map_ok(|data| futures::stream::iter(pieces(data).map(|piece| Ok(Frame::data(piece)))))
        .try_flatten();
    Ok(Form { body: s3s::Body::http_body(StreamBody::new(first.chain(rest))), signed, fields })
}

/// `data` cut into pieces of at most [`MAX_PIECE`], without a copy.
fn pieces(data: Bytes) -> impl Iterator<Item = Bytes> {
    (0..data.len()).step_by(MAX_PIECE).map(move |at| data.slice(at..data.len().min(at + MAX_PIECE)))
}

/// The names of the form's fields before its file, in lower case.
fn fields(form: &[u8], boundary: &str) -> Vec<String> {
    parts(form, boundary).into_iter().map(|p| p.name.to_ascii_lowercase()).take_while(|name| name != "file").collect()
}

/// Whether `fields` (before the form's file) hold a SigV4 or SigV2
/// signature.
fn signed(fields: &[String]) -> bool {
    fields.iter().any(|name| name == "x-amz-signature" || name == "signature")
}

/// A part of a form whose headers have all come.
struct Part {
    /// Where its delimiter starts.
    start: usize,
    /// Where its value starts.
    value_at: usize,
    /// The `name` and `filename` of its Content-Disposition.
    name: String,
    filename: Option<String>,
}

/// The parts of `form` whose headers have all come, in order.
fn parts(form: &[u8], boundary: &str) -> Vec<Part> {
    let delimiter = format!("--{boundary}\r\n");
    let mut found = Vec::new();
    let mut at = 0;
    while let Some(offset) = find(&form[at..], delimiter.as_bytes()) {
        let start = at + offset;
        // A delimiter is a line of its own, as the protocol layer reads
        // it: one within a line is a value's bytes.
        if start != 0 && !form[..start].ends_with(b"\r\n") {
            at = start + 1;
            continue;
        }
        let headers_at = start + delimiter.len();
        let Some(end) = find(&form[headers_at..], b"\r\n\r\n").map(|e| headers_at + e) else { break };
        let headers = std::str::from_utf8(&form[headers_at..end]).unwrap_or_default();
        // The last, as the protocol layer reads a part given two.
        let disposition =
            headers.lines().rfind(|l| l.to_ascii_lowercase().starts_with("content-disposition:")).unwrap_or_default();
        let name = param(disposition, "name").unwrap_or_default();
        found.push(Part { start, value_at: end + 4, name, filename: param(disposition, "filename") });
        at = end + 4;
    }
    found
}

/// The file's name, once the headers of its part have all come.
fn file_part(form: &[u8], boundary: &str) -> Option<String> {
    parts(form, boundary)
        .into_iter()
        .find(|p| p.name.eq_ignore_ascii_case("file"))
        .map(|p| p.filename.unwrap_or_default())
}

/// A parameter of a Content-Disposition line, unquoted. A quoted value
/// runs to the next quote, `;` and all, as the protocol layer reads it.
fn param(line: &str, name: &str) -> Option<String> {
    let mut rest = line.split_once(';')?.1;
    loop {
        let (n, after) = rest.split_once('=')?;
        let after = after.trim_start();
        let (value, next) = match after.strip_prefix('"') {
            Some(quoted) => {
                let (value, next) = quoted.split_once('"')?;
                (value, next.split_once(';').map_or("", |(_, next)| next))
            }
            None => after.split_once(';').map_or((after.trim_end(), ""), |(v, next)| (v.trim_end(), next)),
        };
        if n.trim().eq_ignore_ascii_case(name) {
            return Some(value.to_string());
        }
        rest = next;
    }
}

/// `form` up to its file, with `${filename}` in its key field replaced;
/// `None` when there is nothing to replace.
fn rewrite(form: &[u8], boundary: &str) -> Option<Vec<u8>> {
    let parts = parts(form, boundary);
    let file = parts.iter().position(|p| p.name.eq_ignore_ascii_case("file"))?;
    let key = parts[..file].iter().position(|p| p.name.eq_ignore_ascii_case("key"))?;
    // A value ends with the CRLF before the next part's delimiter.
    let (value_at, value_end) = (parts[key].value_at, parts[key + 1].start.checked_sub(2)?);
    let value = std::str::from_utf8(form.get(value_at..value_end)?).ok()?;
    if !value.contains(FILENAME) {
        return None;
    }
    // The browser's name for the file, without any folders an old browser
    // sent with it.
    let filename = parts[file].filename.as_deref().unwrap_or_default();
    let filename = filename.rsplit(['/', '\\']).next().unwrap_or_default();
    let mut out = form[..value_at].to_vec();
    out.extend_from_slice(value.replace(FILENAME, filename).as_bytes());
    out.extend_from_slice(&form[value_end..]);
    Some(out)
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn form(key: &str, filename: &str) -> Vec<u8> {
        format!(
            "--XyZ\r\nContent-Disposition: form-data; name=\"key\"\r\n\r\n{key}\r\n\
             --XyZ\r\nContent-Disposition: form-data; name=\"policy\"\r\n\r\neyJ9\r\n\
             --XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{filename}\"\r\n\
             Content-Type: text/plain\r\n\r\nthe file's bytes\r\n--XyZ--\r\n"
        )
        .into_bytes()
    }

    #[test]
    fn the_key_takes_the_files_name() {
        let rewritten = rewrite(&form("uploads/${filename}", "photo.jpg"), "XyZ").unwrap();
        assert_eq!(rewritten, form("uploads/photo.jpg", "photo.jpg"));
        let rewritten = rewrite(&form("${filename}", "C:\\Users\\me\\notes.txt"), "XyZ").unwrap();
        assert_eq!(rewritten, form("notes.txt", "C:\\Users\\me\\notes.txt"));
        let rewritten = rewrite(&form("uploads/${filename}", "a;b=c.jpg"), "XyZ").unwrap();
        assert_eq!(rewritten, form("uploads/a;b=c.jpg", "a;b=c.jpg"), "a quoted name runs to its quote");
    }

    #[test]
    fn parameters_are_read_quoted_or_not() {
        let line = "Content-Disposition: form-data; name=\"file\"; filename=\"x; name=y.txt\"";
        assert_eq!(param(line, "name").as_deref(), Some("file"));
        assert_eq!(param(line, "filename").as_deref(), Some("x; name=y.txt"));
        assert_eq!(param("Content-Disposition: form-data; name=key ; other=1", "name").as_deref(), Some("key"));
        assert_eq!(param("Content-Disposition: form-data; name=\"unended", "name"), None);
        assert_eq!(param("Content-Disposition: form-data", "name"), None);
    }

    #[test]
    fn a_key_without_the_variable_or_a_form_cut_short_is_left_alone() {
        assert_eq!(rewrite(&form("uploads/fixed", "photo.jpg"), "XyZ"), None);
        let whole = form("uploads/${filename}", "photo.jpg");
        let file_at = find(&whole, b"name=\"file\"").unwrap();
        assert_eq!(rewrite(&whole[..file_at], "XyZ"), None, "the file's headers have not all come");
        assert_eq!(rewrite(&whole, "other"), None);
    }

    #[test]
    fn a_form_is_signed_by_a_signature_field_before_its_file() {
        let unsigned = form("k", "photo.jpg");
        assert!(!signed(&fields(&unsigned, "XyZ")));
        let field = |name: &str| format!("--XyZ\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\nab12\r\n");
        for name in ["x-amz-signature", "X-Amz-Signature", "signature"] {
            let signed_form = [field(name).as_bytes(), &unsigned].concat();
            assert!(signed(&fields(&signed_form, "XyZ")), "{name}");
        }
        let hidden = String::from_utf8(unsigned.clone()).unwrap().replace(
            "name=\"file\"; filename",
            "name=\"signature\"\r\nContent-Disposition: form-data; name=\"file\"; filename",
        );
        assert!(!signed(&fields(hidden.as_bytes(), "XyZ")), "a part read as the file by its last Content-Disposition");
        let after_the_file =
            [&unsigned[..unsigned.len() - 9], field("x-amz-signature").as_bytes(), b"--XyZ--\r\n"].concat();
        assert!(!signed(&fields(&after_the_file, "XyZ")), "a field after the file is the file's bytes");
        let within_a_value = form("k--XyZ\r\nContent-Disposition: form-data; name=\"signature\"\r\n\r\nz", "f");
        assert_eq!(fields(&within_a_value, "XyZ"), ["key", "policy"], "a delimiter within a line is a value's bytes");
    }

    #[test]
    fn pieces_cover_the_data_in_order() {
        let data = Bytes::from((0..100_000u32).map(|i| i as u8).collect::<Vec<_>>());
        let cut: Vec<Bytes> = pieces(data.clone()).collect();
        assert!(cut.iter().all(|p| !p.is_empty() && p.len() <= MAX_PIECE));
        assert_eq!(cut.concat(), data);
        assert_eq!(pieces(Bytes::new()).count(), 0);
    }

    #[test]
    fn the_boundary_is_read_from_the_content_type() {
        let mut headers = http::HeaderMap::new();
        headers.insert(http::header::CONTENT_TYPE, "multipart/form-data; boundary=\"XyZ\"".parse().unwrap());
        assert_eq!(boundary(&headers).as_deref(), Some("XyZ"));
        headers.insert(http::header::CONTENT_TYPE, "text/plain; boundary=XyZ".parse().unwrap());
        assert_eq!(boundary(&headers), None);
    }
}
