//! Headless Chromium under chromedriver, for the tests that drive the
//! dashboard and the portal in a real browser.

use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::json;

use super::{closed_port, PATIENCE};

/// Whether Chromium and chromedriver are installed; when not, says that
/// `test` is skipped (and fails where CI requires the browser:
/// `HERALD_REQUIRE_BROWSER`).
pub fn browser_installed(test: &str) -> bool {
    super::installed(&[CHROMEDRIVER, CHROMIUM], "HERALD_REQUIRE_BROWSER", test)
}

/// chromedriver on a free local port, in its own process group so that
/// the browsers it starts end with it.
pub struct Chromedriver {
    child: std::process::Child,
    url: String,
    profile: tempfile::TempDir,
}

const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
const CHROMIUM: &str = "/usr/bin/chromium";

impl Chromedriver {
    pub async fn start() -> Chromedriver {
        use std::os::unix::process::CommandExt;
        let port = closed_port().await;
        let child = std::process::Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .process_group(0)
            .spawn()
            .expect("chromedriver starts");
        let driver = Chromedriver {
            child,
            url: format!("http://127.0.0.1:{port}"),
            profile: tempfile::tempdir().expect("profile dir"),
        };
        let deadline = Instant::now() + PATIENCE;
        let client = reqwest::Client::new();
        loop {
            if let Ok(r) = client.get(format!("{}/status", driver.url)).send().await {
                if r.status() == 200 {
                    return driver;
                }
            }
            assert!(Instant::now() < deadline, "chromedriver never answered");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn browser(&self) -> Client {
        let args = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-quic",
            "--disable-dev-shm-usage",
            "--window-size=1400,1000",
            "--lang=en-US",
        ]
        .into_iter()
        .map(str::to_owned)
        .chain([format!("--user-data-dir={}", self.profile.path().display())])
        .collect::<Vec<_>>();
        let mut capabilities = serde_json::Map::new();
        capabilities.insert("browserName".into(), json!("chrome"));
        capabilities.insert(
            "goog:chromeOptions".into(),
            json!({ "binary": CHROMIUM, "args": args }),
        );
        ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(capabilities)
            .connect(&self.url)
            .await
            .expect("chromium starts under chromedriver")
    }
}

impl Drop for Chromedriver {
    fn drop(&mut self) {
        // The group's id is chromedriver's pid: this ends it and the
        // Chromium processes it started, and nothing else.
        if let Ok(pgid) = i32::try_from(self.child.id()) {
            // SAFETY: kill(2) with a negative pid signals that process
            // group; no memory is involved.
            unsafe {
                libc::kill(-pgid, libc::SIGKILL);
            }
        }
        let _ = self.child.wait();
    }
}

/// Waits (bounded) until the element's text contains `text`.
pub async fn wait_for_text(browser: &Client, css: &str, text: &str) -> String {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Ok(el) = browser.find(Locator::Css(css)).await {
            if let Ok(found) = el.text().await {
                if found.contains(text) {
                    return found;
                }
            }
        }
        assert!(
            Instant::now() < deadline,
            "`{text}` never appeared in {css} (at {:?})",
            browser.current_url().await.map(|u| u.to_string())
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Clicks the element `css` finds (the test fails without one).
pub async fn click(browser: &Client, css: &str) {
    browser
        .find(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("{css}: {e}"))
        .click()
        .await
        .unwrap_or_else(|e| panic!("click {css}: {e}"));
}

/// Types `text` into the field `css` finds (the test fails without one).
pub async fn type_into(browser: &Client, css: &str, text: &str) {
    browser
        .find(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("{css}: {e}"))
        .send_keys(text)
        .await
        .unwrap_or_else(|e| panic!("type into {css}: {e}"));
}

/// Takes a screenshot (the test fails unless it is a PNG) and, when the
/// environment variable `asked_by` is `1`, saves it as `docs/<name>`, so
/// that ordinary runs leave the tree alone.
pub async fn screenshot(browser: &Client, name: &str, asked_by: &str) {
    let png = browser.screenshot().await.expect("screenshot");
    assert!(png.starts_with(b"\x89PNG"), "a PNG");
    if std::env::var(asked_by).as_deref() == Ok("1") {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs");
        std::fs::create_dir_all(&dir).expect("docs/ exists");
        std::fs::write(dir.join(name), png).expect("screenshot saved");
    }
}

/// Fails unless the page shown is no wider than the window (nothing to
/// scroll sideways but within a table); `what` names it in the failure.
pub async fn assert_fits_the_window(browser: &Client, what: &str) {
    let widths = browser
        .execute(
            "return [document.documentElement.scrollWidth, window.innerWidth]",
            vec![],
        )
        .await
        .expect("script runs");
    let (page, window) = (widths[0].as_i64(), widths[1].as_i64());
    assert!(
        page.is_some() && page <= window,
        "{what} is {page:?} px wide in a {window:?} px window"
    );
}

/// Fails if a field of the page shown (an input other than a hidden one
/// or a button, a select, a textarea) has no label: none around it, none
/// naming its id, no `aria-label`. `what` names the page in the failure.
pub async fn assert_every_field_is_labelled(browser: &Client, what: &str) {
    let unlabelled = browser
        .execute(
            "return Array.from(document.querySelectorAll('input, select, textarea'))\
               .filter(function (f) { return !['hidden', 'submit', 'button'].includes(f.type); })\
               .filter(function (f) { return !f.closest('label') && !f.getAttribute('aria-label')\
                 && !(f.id && document.querySelector('label[for=\"' + f.id + '\"]')); })\
               .map(function (f) { return f.outerHTML; })",
            vec![],
        )
        .await
        .expect("script runs");
    assert_eq!(unlabelled, json!([]), "fields without a label on {what}");
}
