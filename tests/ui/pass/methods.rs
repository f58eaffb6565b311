use idem::{idempotent, Idem};
use std::sync::Arc;

struct Ledger {
    idem: Idem,
    total: u64,
}

impl Ledger {
    #[idempotent(store = self.idem)]
    async fn read(&self, id: u64) -> Result<u64, idem::Error> {
        Ok(self.total + id)
    }

    #[idempotent(store = self.idem)]
    pub(crate) async fn add(&mut self, id: u64, amount: u64) -> Result<u64, idem::Error> {
        let _ = id;
        self.total += amount;
        Ok(self.total)
    }

    #[idempotent(store = self.idem, key = id)]
    async fn consume(self, id: u64) -> Result<u64, idem::Error> {
        Ok(self.total + id)
    }
}

struct Shared {
    idem: Arc<Idem>,
}

impl Shared {
    #[idempotent(store = self.idem)]
    async fn get(self: Arc<Self>, id: u64) -> Result<u64, idem::Error> {
        Ok(id)
    }
}

fn main() {
    let mut l = Ledger { idem: Idem::memory(), total: 0 };
    let _ = l.read(1);
    let _ = l.add(1, 2);
    let _ = l.consume(3);
    let _ = Arc::new(Shared { idem: Arc::new(Idem::memory()) }).get(1);
}
