//! `trigger disable | enable | delete | fire`.

use clap::Args;
use serde_json::json;

use super::{actor, at_most};
use crate::cli::connect::{self, Target};
use crate::cli::error::CliError;
use crate::store::triggers::{self, Changed};

/// What `trigger disable`, `enable` and `delete` take.
#[derive(Args, Debug)]
pub struct ChangeArgs {
    #[command(flatten)]
    pub target: Target,
    pub id: String,
    /// Who to record (default: $USER), with the database role.
    #[arg(long)]
    pub actor: Option<String>,
    #[arg(long)]
    pub json: bool,
}

fn say_changed(a: &ChangeArgs, what: &str, c: Changed) -> Result<(), CliError> {
    let id = &a.id;
    if a.json {
        let j = json!({"trigger_id": id, "state": what, "changed": c == Changed::Yes});
        println!("{}", serde_json::to_string_pretty(&j)?);
        return Ok(());
    }
    match c {
        Changed::Yes => println!("trigger {id} {what}"),
        Changed::AlreadyThatWay => println!("trigger {id} already {what} (nothing changed)"),
    }
    Ok(())
}

/// `trigger disable`.
pub async fn disable(a: &ChangeArgs, note: Option<&str>) -> Result<(), CliError> {
    at_most("--note", note, 1000)?;
    let mut client = connect::connect_target(&a.target).await?;
    let by = actor(&client, a.actor.as_deref()).await?;
    let c = triggers::disable(&mut client, &a.id, note, &by).await?;
    say_changed(a, "disabled", c)
}

/// `trigger enable`.
pub async fn enable(a: &ChangeArgs) -> Result<(), CliError> {
    let mut client = connect::connect_target(&a.target).await?;
    let by = actor(&client, a.actor.as_deref()).await?;
    let c = triggers::enable(&mut client, &a.id, &by).await?;
    say_changed(a, "enabled", c)
}

/// `trigger delete`.
pub async fn delete(a: &ChangeArgs) -> Result<(), CliError> {
    let mut client = connect::connect_target(&a.target).await?;
    let by = actor(&client, a.actor.as_deref()).await?;
    let c = triggers::delete(&mut client, &a.id, &by).await?;
    say_changed(a, "deleted", c)
}

fn valid_request_id(s: &str) -> bool {
    (1..=128).contains(&s.len())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-'))
}

/// `trigger fire`.
pub async fn fire(
    target: &Target,
    id: &str,
    request_id: Option<&str>,
    actor_name: Option<&str>,
    overlap: Option<crate::store::overlap::OverlapPolicy>,
    json: bool,
) -> Result<(), CliError> {
    let request_id = match request_id {
        Some(r) if !valid_request_id(r) => return Err(CliError::BadRequestId { value: r.into() }),
        Some(r) => r.to_string(),
        None => uuid::Uuid::new_v4().simple().to_string(),
    };
    let mut client = connect::connect_target(target).await?;
    let by = format!("fire:{}", actor(&client, actor_name).await?);
    let f = triggers::fire_with(&mut client, id, &request_id, &by, overlap).await?;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "trigger_id": id, "request_id": request_id, "run_id": f.run_id.to_string(),
                "idempotency_key": f.idempotency_key, "scheduled_for_ms": f.scheduled_for_ms,
                "admitted": f.admitted,
            }))?
        );
    } else if f.admitted {
        println!(
            "trigger {id} fired: run {} key {} (request id {request_id})",
            f.run_id, f.idempotency_key
        );
    } else {
        println!(
            "trigger {id} was already fired with request id {request_id}: run {} (nothing new admitted)",
            f.run_id
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_follow_the_key_alphabet() {
        assert!(valid_request_id("deploy-2026.03:1_a"));
        assert!(!valid_request_id(""));
        assert!(!valid_request_id("has space"));
        assert!(!valid_request_id(&"x".repeat(129)));
    }
}
