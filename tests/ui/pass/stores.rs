use idem::{idempotent, Idem};
use std::sync::{Arc, LazyLock};

static STORE: LazyLock<Idem> = LazyLock::new(Idem::memory);

#[idempotent(store = STORE)]
async fn from_static(n: u64) -> Result<u64, idem::Error> {
    Ok(n)
}

#[idempotent(store = handle, key = n)]
async fn from_arc(n: u64, handle: Arc<Idem>) -> Result<u64, idem::Error> {
    Ok(n)
}

struct App {
    idem: Idem,
}

#[idempotent(store = app.idem, skip(app))]
async fn from_field(n: u64, app: &App) -> Result<u64, idem::Error> {
    Ok(n)
}

#[idempotent]
async fn installed(n: u64) -> Result<u64, idem::Error> {
    Ok(n)
}

fn assert_send<F: std::future::Future + Send + 'static>(_: F) {}

fn main() {
    assert_send(from_static(1));
    assert_send(from_arc(1, Arc::new(Idem::memory())));
    assert_send(installed(1));
    let app = App { idem: Idem::memory() };
    let _ = from_field(1, &app);
}
