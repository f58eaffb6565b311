use idem::idempotent;

#[idempotent(resume, skip(log))]
async fn ship(order: u64, (a, b): (u8, u8), log: &mut Vec<u64>) -> Result<u64, idem::Error> {
    log.push(order + u64::from(a + b));
    Ok(order)
}

fn main() {}
