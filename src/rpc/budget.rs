//! Decoding with an item budget: a serde [`Deserializer`] wrapper that counts every element of
//! a sequence or map and every field of a struct, tuple or variant, and fails as soon as a
//! message holds more than its budget, before the element is decoded.
//!
//! Why: a bincode element can take one byte on the wire (an empty string) and 24 or more in
//! memory, so a 64 MiB frame of empty keys decodes to gigabytes. Strings and byte buffers need
//! no budget: bincode checks their length prefix against the bytes left in the payload before
//! allocating. With the budget a decoded message holds at most `payload + items × (largest
//! element)` bytes. Stateless apart from the caller's [`Budget`]; single-threaded use.

use serde::de::{
    self, DeserializeSeed, Deserializer, EnumAccess, MapAccess, SeqAccess, VariantAccess, Visitor,
};
use std::cell::Cell;
use std::fmt;

/// Items a decode may still produce, and whether it ran out.
pub(crate) struct Budget {
    left: Cell<usize>,
    exceeded: Cell<bool>,
}

/// The error text of a decode stopped by its budget.
const EXCEEDED: &str = "message holds more items than the server accepts";

impl Budget {
    /// A budget of `items` elements and fields.
    pub(crate) fn new(items: usize) -> Budget {
        Budget {
            left: Cell::new(items),
            exceeded: Cell::new(false),
        }
    }

    /// Whether a decode failed because the budget ran out.
    pub(crate) fn exceeded(&self) -> bool {
        self.exceeded.get()
    }

    fn spend<E: de::Error>(&self) -> Result<(), E> {
        match self.left.get().checked_sub(1) {
            Some(left) => {
                self.left.set(left);
                Ok(())
            }
            None => {
                self.exceeded.set(true);
                Err(E::custom(EXCEEDED))
            }
        }
    }
}

/// A [`DeserializeSeed`] decoding a `T` through [`Budgeted`]; pass it to bincode's
/// `Options::deserialize_seed`.
pub(crate) struct Seed<'b, S> {
    pub(crate) inner: S,
    pub(crate) budget: &'b Budget,
}

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for Seed<'_, S> {
    type Value = S::Value;

    fn deserialize<D: Deserializer<'de>>(self, inner: D) -> Result<S::Value, D::Error> {
        self.inner.deserialize(Budgeted {
            inner,
            budget: self.budget,
        })
    }
}

/// A deserializer that spends its budget on every element and field it yields.
struct Budgeted<'b, D> {
    inner: D,
    budget: &'b Budget,
}

/// Wraps a visitor, seed or access object in its budgeted form.
struct With<'b, T> {
    inner: T,
    budget: &'b Budget,
}

impl<'b, T> With<'b, T> {
    fn new(inner: T, budget: &'b Budget) -> Self {
        With { inner, budget }
    }
}

/// Forwards methods whose visitor gets only a scalar (nothing to count).
macro_rules! scalars {
    ($($method:ident),*) => {$(
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
            self.inner.$method(visitor)
        }
    )*};
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for Budgeted<'_, D> {
    type Error = D::Error;

    scalars!(
        deserialize_bool,
        deserialize_i8,
        deserialize_i16,
        deserialize_i32,
        deserialize_i64,
        deserialize_i128,
        deserialize_u8,
        deserialize_u16,
        deserialize_u32,
        deserialize_u64,
        deserialize_u128,
        deserialize_f32,
        deserialize_f64,
        deserialize_char,
        deserialize_str,
        deserialize_string,
        deserialize_bytes,
        deserialize_byte_buf,
        deserialize_unit,
        deserialize_identifier,
        deserialize_ignored_any
    );

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.inner.deserialize_any(With::new(visitor, self.budget))
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.inner
            .deserialize_option(With::new(visitor, self.budget))
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.inner.deserialize_unit_struct(name, visitor)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.inner
            .deserialize_newtype_struct(name, With::new(visitor, self.budget))
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.inner.deserialize_seq(With::new(visitor, self.budget))
    }

    fn deserialize_tuple<V: Visitor<'de>>(
        self,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.inner
            .deserialize_tuple(len, With::new(visitor, self.budget))
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.inner
            .deserialize_tuple_struct(name, len, With::new(visitor, self.budget))
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.inner.deserialize_map(With::new(visitor, self.budget))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.inner
            .deserialize_struct(name, fields, With::new(visitor, self.budget))
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        self.inner
            .deserialize_enum(name, variants, With::new(visitor, self.budget))
    }

    fn is_human_readable(&self) -> bool {
        self.inner.is_human_readable()
    }
}

impl<'de, V: Visitor<'de>> Visitor<'de> for With<'_, V> {
    type Value = V::Value;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        self.inner.expecting(formatter)
    }

    fn visit_none<E: de::Error>(self) -> Result<V::Value, E> {
        self.inner.visit_none()
    }

    fn visit_some<D: Deserializer<'de>>(self, inner: D) -> Result<V::Value, D::Error> {
        self.inner.visit_some(Budgeted {
            inner,
            budget: self.budget,
        })
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(self, inner: D) -> Result<V::Value, D::Error> {
        self.inner.visit_newtype_struct(Budgeted {
            inner,
            budget: self.budget,
        })
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<V::Value, A::Error> {
        self.inner.visit_seq(With::new(seq, self.budget))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<V::Value, A::Error> {
        self.inner.visit_map(With::new(map, self.budget))
    }

    fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<V::Value, A::Error> {
        self.inner.visit_enum(With::new(data, self.budget))
    }
}

impl<'de, A: SeqAccess<'de>> SeqAccess<'de> for With<'_, A> {
    type Error = A::Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, A::Error> {
        if self.inner.size_hint() == Some(0) {
            return Ok(None);
        }
        self.budget.spend()?;
        let budget = self.budget;
        self.inner.next_element_seed(Seed {
            inner: seed,
            budget,
        })
    }

    fn size_hint(&self) -> Option<usize> {
        // Callers preallocate from the hint: never more than the budget allows.
        self.inner
            .size_hint()
            .map(|hint| hint.min(self.budget.left.get()))
    }
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for With<'_, A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        if self.inner.size_hint() == Some(0) {
            return Ok(None);
        }
        self.budget.spend()?;
        let budget = self.budget;
        self.inner.next_key_seed(Seed {
            inner: seed,
            budget,
        })
    }

    fn next_value_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<T::Value, A::Error> {
        let budget = self.budget;
        self.inner.next_value_seed(Seed {
            inner: seed,
            budget,
        })
    }

    fn size_hint(&self) -> Option<usize> {
        self.inner
            .size_hint()
            .map(|hint| hint.min(self.budget.left.get()))
    }
}

impl<'de, 'b, A: EnumAccess<'de>> EnumAccess<'de> for With<'b, A> {
    type Error = A::Error;
    type Variant = With<'b, A::Variant>;

    fn variant_seed<T: DeserializeSeed<'de>>(
        self,
        seed: T,
    ) -> Result<(T::Value, Self::Variant), A::Error> {
        let (value, variant) = self.inner.variant_seed(seed)?;
        Ok((value, With::new(variant, self.budget)))
    }
}

impl<'de, A: VariantAccess<'de>> VariantAccess<'de> for With<'_, A> {
    type Error = A::Error;

    fn unit_variant(self) -> Result<(), A::Error> {
        self.inner.unit_variant()
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, A::Error> {
        self.inner.newtype_variant_seed(Seed {
            inner: seed,
            budget: self.budget,
        })
    }

    fn tuple_variant<V: Visitor<'de>>(self, len: usize, visitor: V) -> Result<V::Value, A::Error> {
        self.inner
            .tuple_variant(len, With::new(visitor, self.budget))
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, A::Error> {
        self.inner
            .struct_variant(fields, With::new(visitor, self.budget))
    }
}
