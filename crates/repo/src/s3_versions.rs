//! The S3 requests object_store does not make: a bucket's Object Lock configuration, and
//! object *versions* (list them, read the retention of one, delete one for good).
//!
//! Why: an immutable repository (`repo-s3-object-lock`) lives in a bucket with Object Lock,
//! which is always versioned. There a plain DELETE only hides an object behind a delete
//! marker, and the versions stay until their retention date has passed; so
//!
//! - stanza-create and check ask the bucket whether Object Lock is on and which default
//!   retention it gives every new object ([`S3Versions::lock_configuration`]), and read the
//!   retention S3 actually gave a probe they wrote ([`S3Versions::retention`]);
//! - expire lists the versions of the objects it removes and deletes each version for good
//!   once its retention has passed ([`S3Versions::delete_version`]), never before;
//! - `repo-target-time` reads the repository as it was at a time, from the versions
//!   ([`S3Versions::list_versions`], then reads by version id through object_store).
//!
//! Requests are signed with object_store's own SigV4 signer and credentials (the same
//! ones the repository's store uses: environment, instance metadata, or the configured
//! key) and sent through object_store's HTTP client with the repository's TLS settings.

use crate::error::{Error, ErrorKind, Result};
use bytes::Bytes;
use object_store::aws::{AwsAuthorizer, AwsCredentialProvider};
use object_store::client::{HttpClient, HttpConnector, HttpRequest, ReqwestConnector};
use serde::Deserialize;

// The retention mode of an Object Lock, as configured (`repoN-s3-object-lock`).
crate::named! {
    pub enum LockMode { Compliance = "compliance", Governance = "governance" }
}

impl LockMode {
    /// As S3 spells it.
    pub fn s3_name(self) -> &'static str {
        match self {
            LockMode::Compliance => "COMPLIANCE",
            LockMode::Governance => "GOVERNANCE",
        }
    }
}

/// What an immutable repository promises: every object it writes carries a retention of
/// `days` days in `mode` (the bucket's default retention gives it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObjectLock {
    pub mode: LockMode,
    pub days: u32,
}

impl ObjectLock {
    /// Until when an object written at `written` (unix seconds) may not be deleted.
    pub fn retained_until(&self, written: i64) -> i64 {
        written + i64::from(self.days) * 86_400
    }
}

/// A bucket's Object Lock configuration as S3 reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockConfiguration {
    /// Object Lock is not enabled on the bucket (it can only be enabled when the bucket is
    /// made, or on a versioned bucket).
    Disabled,
    /// Enabled, with this default retention for new objects (`None`: no default).
    Enabled(Option<(String, u32)>),
}

/// One version of an object, or a delete marker.
#[derive(Debug, Clone)]
pub struct ObjectVersion {
    /// The object's name inside the repository (the repository's prefix removed).
    pub key: String,
    pub version_id: String,
    /// Unix seconds.
    pub modified: i64,
    pub size: u64,
    pub delete_marker: bool,
    pub latest: bool,
}

/// Where an S3 bucket is (AWS's endpoint for the region when `endpoint` is `None`).
pub(crate) struct Bucket<'a> {
    pub name: &'a str,
    pub endpoint: Option<&'a str>,
    pub region: Option<&'a str>,
    pub path_style: bool,
}

/// The bucket of an S3 repository, for the requests object_store does not make.
#[derive(Debug, Clone)]
pub struct S3Versions {
    client: HttpClient,
    credentials: AwsCredentialProvider,
    /// `https://host[/bucket]`: objects are `{base}/{key}`, bucket requests `{base}/?…`.
    base: String,
    region: String,
    /// The repository's path in the bucket, with a trailing `/` (empty at the root).
    prefix: String,
}

impl S3Versions {
    /// The client of `bucket`, for the repository at `path` in it.
    pub(crate) fn new(
        options: &object_store::ClientOptions,
        credentials: AwsCredentialProvider,
        bucket: &Bucket<'_>,
        path: &str,
    ) -> Result<S3Versions> {
        let region = bucket.region.unwrap_or("us-east-1").to_string();
        let name = bucket.name;
        let base = match (bucket.endpoint, bucket.path_style) {
            (Some(e), true) => format!("{}/{name}", e.trim_end_matches('/')),
            // A custom endpoint for virtual-hosted requests names the bucket's host itself
            // (as object_store takes it).
            (Some(e), false) => e.trim_end_matches('/').to_string(),
            (None, true) => format!("https://s3.{region}.amazonaws.com/{name}"),
            (None, false) => format!("https://{name}.s3.{region}.amazonaws.com"),
        };
        let client = ContentMd5Connector
            .connect(options)
            .map_err(|e| Error::with_source(ErrorKind::Invalid, "configure the S3 client", e))?;
        let path = path.trim_matches('/');
        Ok(S3Versions {
            client,
            credentials,
            base,
            region,
            prefix: if path.is_empty() {
                String::new()
            } else {
                format!("{path}/")
            },
        })
    }

    /// Send a signed request without a body; the response's status, headers and body.
    async fn send(
        &self,
        method: http::Method,
        url: String,
        what: &str,
    ) -> Result<(http::StatusCode, http::HeaderMap, Bytes)> {
        let credential = self.credentials.get_credential().await.map_err(|e| {
            Error::with_source(ErrorKind::Invalid, format!("{what}: credentials"), e)
        })?;
        let mut request: HttpRequest = http::Request::builder()
            .method(method)
            .uri(&url)
            .body(Bytes::new().into())
            .map_err(|e| Error::with_source(ErrorKind::Invalid, format!("{what}: {url}"), e))?;
        AwsAuthorizer::new(&credential, "s3", &self.region)
            .try_authorize(&mut request, None)
            .map_err(|e| Error::with_source(ErrorKind::Invalid, format!("{what}: sign"), e))?;
        let response = self
            .client
            .execute(request)
            .await
            .map_err(|e| Error::with_source(ErrorKind::Storage, what.to_string(), e))?;
        let (parts, body) = response.into_parts();
        let body = body
            .bytes()
            .await
            .map_err(|e| Error::with_source(ErrorKind::Storage, what.to_string(), e))?;
        Ok((parts.status, parts.headers, body))
    }

    /// [`S3Versions::send`], an answer that is not a success refused: its headers and body.
    async fn send_ok(
        &self,
        method: http::Method,
        url: String,
        what: &str,
    ) -> Result<(http::HeaderMap, Bytes)> {
        let (status, headers, body) = self.send(method, url, what).await?;
        if !status.is_success() {
            return Err(Self::refused(status, &body, what));
        }
        Ok((headers, body))
    }

    /// The URL of object `key` of the repository.
    fn object_url(&self, key: &str) -> String {
        format!(
            "{}/{}",
            self.base,
            encode(&format!("{}{key}", self.prefix), false)
        )
    }

    /// An error for an answer that is not a success: S3's code and message in it.
    fn refused(status: http::StatusCode, body: &[u8], what: &str) -> Error {
        let text = String::from_utf8_lossy(body);
        let code = xml_field(&text, "Code").unwrap_or_default();
        let message = xml_field(&text, "Message").unwrap_or_default();
        let kind = match status.as_u16() {
            403 | 400 | 405 | 409 => ErrorKind::Invalid,
            404 => ErrorKind::NotFound,
            _ => ErrorKind::Storage,
        };
        Error::new(
            kind,
            format!("{what}: S3 answered {status} {code} {message}")
                .trim()
                .to_string(),
        )
    }

    /// The bucket's Object Lock configuration.
    pub async fn lock_configuration(&self) -> Result<LockConfiguration> {
        let what = "read the bucket's Object Lock configuration";
        let (status, _, body) = self
            .send(
                http::Method::GET,
                format!("{}/?object-lock", self.base),
                what,
            )
            .await?;
        if !status.is_success() {
            let text = String::from_utf8_lossy(&body);
            if xml_field(&text, "Code").as_deref() == Some("ObjectLockConfigurationNotFoundError") {
                return Ok(LockConfiguration::Disabled);
            }
            return Err(Self::refused(status, &body, what));
        }
        let parsed: LockConfigurationXml = parse_xml(&body, what)?;
        if parsed.object_lock_enabled.as_deref() != Some("Enabled") {
            return Ok(LockConfiguration::Disabled);
        }
        let default = parsed.rule.and_then(|r| r.default_retention).and_then(|d| {
            let days = match (d.days, d.years) {
                (Some(days), _) if days > 0 => days,
                (_, Some(years)) if years > 0 => years * 365,
                _ => return None,
            };
            Some((d.mode.unwrap_or_default(), days))
        });
        Ok(LockConfiguration::Enabled(default))
    }

    /// The retention S3 holds for object `key` (its current version): mode and until when
    /// (unix seconds), or `None` when it has none.
    pub async fn retention(&self, key: &str) -> Result<Option<(String, i64)>> {
        let what = format!("read the retention of {key}");
        let (headers, _) = self
            .send_ok(http::Method::HEAD, self.object_url(key), &what)
            .await?;
        let header = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let (Some(mode), Some(until)) = (
            header("x-amz-object-lock-mode"),
            header("x-amz-object-lock-retain-until-date"),
        ) else {
            return Ok(None);
        };
        let until = parse_time(&until, &what)?;
        Ok(Some((mode, until)))
    }

    /// Every version and delete marker of every object whose name starts with `prefix`
    /// (inside the repository), in S3's order: by name, newest version first.
    pub async fn list_versions(&self, prefix: &str) -> Result<Vec<ObjectVersion>> {
        let what = format!("list the versions under {}{prefix}", self.prefix);
        let full_prefix = format!("{}{prefix}", self.prefix);
        let mut out = Vec::new();
        let mut marker: Option<(String, String)> = None;
        loop {
            let mut url = format!(
                "{}/?versions&prefix={}",
                self.base,
                encode(&full_prefix, true)
            );
            if let Some((key, version)) = &marker {
                url.push_str(&format!(
                    "&key-marker={}&version-id-marker={}",
                    encode(key, true),
                    encode(version, true)
                ));
            }
            let (_, body) = self.send_ok(http::Method::GET, url, &what).await?;
            let page: ListVersionsXml = parse_xml(&body, &what)?;
            for (v, delete_marker) in page
                .versions
                .into_iter()
                .map(|v| (v, false))
                .chain(page.delete_markers.into_iter().map(|v| (v, true)))
            {
                let Some(key) = v.key.strip_prefix(&self.prefix) else {
                    continue;
                };
                out.push(ObjectVersion {
                    key: key.to_string(),
                    version_id: v.version_id,
                    modified: parse_time(&v.last_modified, &what)?,
                    size: v.size.unwrap_or(0),
                    delete_marker,
                    latest: v.is_latest,
                });
            }
            match (
                page.is_truncated,
                page.next_key_marker,
                page.next_version_id_marker,
            ) {
                (true, Some(key), Some(version)) => marker = Some((key, version)),
                (true, ..) => {
                    return Err(Error::new(
                        ErrorKind::Storage,
                        format!("{what}: a truncated answer without the next markers"),
                    ))
                }
                _ => break,
            }
        }
        // Newest first within an object, whatever the order of versions and markers.
        out.sort_by(|a, b| {
            a.key
                .cmp(&b.key)
                .then(b.modified.cmp(&a.modified))
                .then(b.latest.cmp(&a.latest))
        });
        Ok(out)
    }

    /// Delete one version of `key` for good. S3 refuses (`Invalid`) while the version's
    /// retention lasts.
    pub async fn delete_version(&self, key: &str, version_id: &str) -> Result<()> {
        let what = format!("delete version {version_id} of {key}");
        let url = format!(
            "{}?versionId={}",
            self.object_url(key),
            encode(version_id, true)
        );
        self.send_ok(http::Method::DELETE, url, &what).await?;
        Ok(())
    }
}

/// The HTTP client of an immutable repository's store: it adds `Content-MD5` to every PUT.
///
/// S3 refuses a PUT into a bucket with a default retention unless the request says how
/// its body can be checked (`Content-MD5`, or an SDK checksum header); MinIO and others
/// ask for `Content-MD5` alone. object_store sends neither, so it is added here, after
/// signing, which SigV4 allows for `Content-MD5` (only `host`, `content-type` and the
/// `x-amz-*` headers must be signed).
#[derive(Debug, Default)]
pub(crate) struct ContentMd5Connector;

impl HttpConnector for ContentMd5Connector {
    fn connect(&self, options: &object_store::ClientOptions) -> object_store::Result<HttpClient> {
        Ok(HttpClient::new(ContentMd5(
            ReqwestConnector::default().connect(options)?,
        )))
    }
}

#[derive(Debug)]
struct ContentMd5(HttpClient);

#[async_trait::async_trait]
impl object_store::client::HttpService for ContentMd5 {
    async fn call(
        &self,
        mut request: HttpRequest,
    ) -> std::result::Result<object_store::client::HttpResponse, object_store::client::HttpError>
    {
        if request.method() == http::Method::PUT && !request.headers().contains_key("content-md5") {
            use base64::Engine;
            use http_body_util::BodyExt;
            use md5::Digest;
            let mut md5 = md5::Md5::new();
            // A clone shares the body's buffers: nothing is copied.
            let mut body = request.body().clone();
            while let Some(frame) = body.frame().await {
                if let Ok(data) = frame?.into_data() {
                    md5.update(&data);
                }
            }
            let digest = base64::engine::general_purpose::STANDARD.encode(md5.finalize());
            let value = http::HeaderValue::from_str(&digest).expect("base64 is a header value");
            request.headers_mut().insert("content-md5", value);
        }
        self.0.execute(request).await
    }
}

/// Percent-encode `s` for a URL path (`/` kept) or a query value (`/` encoded too).
fn encode(s: &str, query: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                out.push(b as char)
            }
            b'/' if !query => out.push('/'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// An RFC 3339 time (S3's `LastModified`, retain-until dates) as unix seconds.
fn parse_time(text: &str, what: &str) -> Result<i64> {
    chrono::DateTime::parse_from_rfc3339(text)
        .map(|t| t.timestamp())
        .map_err(|e| Error::with_source(ErrorKind::Storage, format!("{what}: time '{text}'"), e))
}

fn parse_xml<T: serde::de::DeserializeOwned>(body: &[u8], what: &str) -> Result<T> {
    let text = std::str::from_utf8(body)
        .map_err(|e| Error::with_source(ErrorKind::Storage, format!("{what}: answer"), e))?;
    quick_xml::de::from_str(text)
        .map_err(|e| Error::with_source(ErrorKind::Storage, format!("{what}: answer"), e))
}

/// The text of the first `<name>` element: error answers' `Code` and `Message`.
fn xml_field(text: &str, name: &str) -> Option<String> {
    let start = text.find(&format!("<{name}>"))? + name.len() + 2;
    let end = text[start..].find(&format!("</{name}>"))? + start;
    Some(text[start..end].to_string())
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct LockConfigurationXml {
    object_lock_enabled: Option<String>,
    rule: Option<RuleXml>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct RuleXml {
    default_retention: Option<DefaultRetentionXml>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct DefaultRetentionXml {
    mode: Option<String>,
    days: Option<u32>,
    years: Option<u32>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ListVersionsXml {
    #[serde(default)]
    is_truncated: bool,
    next_key_marker: Option<String>,
    next_version_id_marker: Option<String>,
    #[serde(rename = "Version", default)]
    versions: Vec<VersionXml>,
    #[serde(rename = "DeleteMarker", default)]
    delete_markers: Vec<VersionXml>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct VersionXml {
    key: String,
    version_id: String,
    #[serde(default)]
    is_latest: bool,
    last_modified: String,
    size: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_and_delete_markers_interleaved_are_all_read() {
        let xml = r#"<?xml version="1.0" encoding="UTF-8"?>
<ListVersionsResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
  <Name>b</Name><Prefix>r/</Prefix><IsTruncated>true</IsTruncated>
  <NextKeyMarker>r/b</NextKeyMarker><NextVersionIdMarker>v3</NextVersionIdMarker>
  <DeleteMarker><Key>r/a</Key><VersionId>v2</VersionId><IsLatest>true</IsLatest><LastModified>2026-11-28T10:00:01.000Z</LastModified></DeleteMarker>
  <Version><Key>r/a</Key><VersionId>v1</VersionId><IsLatest>false</IsLatest><LastModified>2026-11-28T10:00:00.000Z</LastModified><Size>5</Size></Version>
  <Version><Key>r/b</Key><VersionId>v3</VersionId><IsLatest>true</IsLatest><LastModified>2026-11-28T09:00:00Z</LastModified><Size>7</Size></Version>
</ListVersionsResult>"#;
        let page: ListVersionsXml = parse_xml(xml.as_bytes(), "test").unwrap();
        assert!(page.is_truncated);
        assert_eq!(page.next_version_id_marker.as_deref(), Some("v3"));
        assert_eq!(page.versions.len(), 2);
        assert_eq!(page.delete_markers.len(), 1);
        assert_eq!(page.versions[0].size, Some(5));
        assert_eq!(
            parse_time(&page.versions[1].last_modified, "t").unwrap(),
            1_795_856_400
        );
    }

    #[test]
    fn a_lock_configuration_with_a_default_retention_is_read() {
        let xml = "<ObjectLockConfiguration><ObjectLockEnabled>Enabled</ObjectLockEnabled><Rule><DefaultRetention><Mode>COMPLIANCE</Mode><Days>7</Days></DefaultRetention></Rule></ObjectLockConfiguration>";
        let c: LockConfigurationXml = parse_xml(xml.as_bytes(), "t").unwrap();
        let d = c.rule.unwrap().default_retention.unwrap();
        assert_eq!((d.mode.as_deref(), d.days), (Some("COMPLIANCE"), Some(7)));
    }

    #[test]
    fn names_are_encoded_for_paths_and_queries() {
        assert_eq!(
            encode("st/archive/15-1/a b", false),
            "st/archive/15-1/a%20b"
        );
        assert_eq!(encode("st/a+b", true), "st%2Fa%2Bb");
    }
}
