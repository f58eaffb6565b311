use idem::{idempotent, Idem};

#[allow(async_fn_in_trait)]
pub trait Charger {
    async fn charge(&self, order: u64) -> Result<u64, idem::Error>;
    fn charge_send(&self, order: u64) -> impl std::future::Future<Output = Result<u64, idem::Error>> + Send;
}

#[allow(async_fn_in_trait)]
/// A trait's default method with a body works too.
pub trait WithDefault {
    fn idem(&self) -> &Idem;

    #[idempotent(store = self.idem())]
    async fn refund(&self, order: u64) -> Result<u64, idem::Error> {
        Ok(order)
    }
}

pub struct Stripe {
    idem: Idem,
}

impl Charger for Stripe {
    #[idempotent(store = self.idem)]
    async fn charge(&self, order: u64) -> Result<u64, idem::Error> {
        Ok(order)
    }

    // A trait that requires `Send` futures: the expansion's future is `Send`.
    #[idempotent(store = self.idem)]
    async fn charge_send(&self, order: u64) -> Result<u64, idem::Error> {
        Ok(order)
    }
}

impl WithDefault for Stripe {
    fn idem(&self) -> &Idem {
        &self.idem
    }
}

fn main() {
    let s = Stripe { idem: Idem::memory() };
    let _ = s.charge(1);
    let _ = s.charge_send(1);
    let _ = s.refund(1);
}
